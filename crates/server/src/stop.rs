//! Stop strings: generated text is held back while it could still be the start of a
//! stop string, so a client never sees part of one, and generation ends at the first
//! whole one (which is not emitted).

/// Matches stop strings over a stream of text pieces.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet released (a possible stop string's prefix).
    held: String,
}

/// What one piece of text released.
#[derive(Debug, PartialEq, Eq)]
pub struct Released {
    pub text: String,
    /// A stop string was found: `text` is everything before it; generation ends.
    pub stopped: bool,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        let stops = stops.into_iter().filter(|s| !s.is_empty()).collect();
        StopMatcher {
            stops,
            held: String::new(),
        }
    }

    pub fn push(&mut self, piece: &str) -> Released {
        self.held.push_str(piece);
        if self.stops.is_empty() {
            return Released {
                text: std::mem::take(&mut self.held),
                stopped: false,
            };
        }
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s)).min() {
            self.held.truncate(at);
            return Released {
                text: std::mem::take(&mut self.held),
                stopped: true,
            };
        }
        // Keep the longest suffix that is a proper prefix of some stop string.
        let keep = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.held.len());
        let rest = self.held.split_off(keep);
        Released {
            text: std::mem::replace(&mut self.held, rest),
            stopped: false,
        }
    }

    /// The end of generation: what was held is text after all.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let r = m.push(p);
            out += &r.text;
            if r.stopped {
                return (out, true);
            }
        }
        out += &m.flush();
        (out, false)
    }

    #[test]
    fn a_stop_string_split_across_pieces_is_never_emitted() {
        assert_eq!(
            run(&["END"], &["ab", "cE", "N", "Dxyz"]),
            ("abc".into(), true)
        );
        assert_eq!(run(&["\n\n"], &["a\n", "\nb"]), ("a".into(), true));
    }

    #[test]
    fn a_prefix_that_does_not_complete_is_released() {
        assert_eq!(run(&["END"], &["EN", "x"]), ("ENx".into(), false));
        assert_eq!(run(&["END"], &["E"]), ("E".into(), false));
    }

    #[test]
    fn the_earliest_of_several_stops_wins() {
        assert_eq!(run(&["cd", "b"], &["abcd"]), ("a".into(), true));
    }

    #[test]
    fn held_text_is_released_as_soon_as_it_cannot_start_a_stop() {
        let mut m = StopMatcher::new(vec!["<end>".into()]);
        assert_eq!(m.push("hi <").text, "hi ");
        assert_eq!(m.push("b").text, "<b");
        assert_eq!(m.push("é<e").text, "é");
    }

    #[test]
    fn without_stops_everything_passes() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
        assert_eq!(run(&[""], &["a", "b"]), ("ab".into(), false));
    }
}
