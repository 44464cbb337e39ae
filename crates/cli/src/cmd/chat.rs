//! `llamay chat` (cli.md): an interactive conversation through the chat template. The
//! conversation stays in the KV cache: each turn renders the whole conversation, keeps
//! the cached tokens it shares with it, and prefills only the rest (reported per turn
//! on stderr). Ctrl-C stops the answer being generated, not the program. When stdin is
//! not a terminal, each line is a user turn, and the program exits 0 at its end.

use crate::ModelArg;
use crate::chat;
use crate::constrain::{Bound, ConstraintArgs};
use crate::generate::{Flow, Sampling, SamplingArgs, Speculation, keep_shared_prefix, prefill};
use crate::{session, speculate};
use anyhow::{Context as _, bail};
use llamay_engine::sample::{Sampler, SamplerParams};
use llamay_engine::{Context, ContextParams, SeqId};
use llamay_gguf::MappedModel;
use llamay_template::format::{self as chat_format, ChatFormat};
use llamay_template::{Event, Message, OutputParser};
use llamay_tokenizer::{StreamDecoder, Tokenizer};
use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    device: crate::device::DeviceArg,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    constraint: ConstraintArgs,
    /// Context size (0: the model's training context).
    #[arg(short = 'c', long = "ctx-size")]
    ctx_size: Option<usize>,
    /// KV cache precision: f32 (exact), f16, vq8 (int8 values), q8 (int8 keys and values).
    #[arg(long, default_value = "f32")]
    kv: String,
    /// A system message to start the conversation with (`/system` changes it).
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,
    /// A built-in template name or a Jinja file, instead of the model's own.
    #[arg(long, value_name = "NAME|FILE")]
    chat_template: Option<String>,
    /// Template variables as a JSON object, e.g. '{"enable_thinking": false}'.
    #[arg(long, value_name = "JSON")]
    chat_template_kwargs: Option<String>,
    /// Show the model's reasoning (dimmed on a terminal); hidden by default.
    #[arg(long)]
    show_reasoning: bool,
    #[arg(short = 't', long)]
    threads: Option<usize>,
}

const HELP: &str = "\
/help            this list
/system TEXT     set the system message (/system alone removes it)
/clear           forget the conversation (the system message stays)
/save FILE       save the conversation: its transcript and its KV cache
/load FILE       continue a saved conversation
/bye             quit (also /exit, or Ctrl-D)
Multi-line input: end a line with \\ to continue it, or wrap the text in \"\"\".
Ctrl-C stops the answer being generated.";

/// Set by Ctrl-C while an answer is generated; read after each token.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);
/// Whether an answer is being generated (Ctrl-C at the prompt only prints a hint).
static GENERATING: AtomicBool = AtomicBool::new(false);

#[cfg(not(target_family = "wasm"))]
extern "C" fn on_sigint(_: libc::c_int) {
    if GENERATING.load(Ordering::SeqCst) {
        INTERRUPTED.store(true, Ordering::SeqCst);
    } else {
        const HINT: &[u8] = b"\n(Ctrl-D or /bye to quit)\n";
        // SAFETY: write(2) is async-signal-safe; the buffer is a static.
        unsafe { libc::write(2, HINT.as_ptr().cast(), HINT.len()) };
    }
}

/// Ctrl-C becomes a flag instead of the end of the process (WASI has no signals:
/// there Ctrl-C ends the program, as the runtime decides).
#[cfg(target_family = "wasm")]
fn catch_ctrl_c() {}

/// Ctrl-C becomes a flag instead of the end of the process.
#[cfg(not(target_family = "wasm"))]
fn catch_ctrl_c() {
    // SAFETY: installs a handler that only touches atomics and calls write(2); the
    // sigaction struct is fully initialised (zeroed, then the fields set).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigint as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
    }
}

/// The conversation and where it lives in the cache.
struct Conversation {
    system: Option<String>,
    /// User, assistant (and tool) turns.
    turns: Vec<Message>,
    seq: SeqId,
}

impl Conversation {
    fn messages(&self) -> Vec<Message> {
        let mut m: Vec<Message> = self
            .system
            .iter()
            .map(|s| Message::new("system", s))
            .collect();
        m.extend(self.turns.iter().cloned());
        m
    }
}

/// What one line (or block) of input asks for.
enum Input {
    Turn(String),
    Command(String, String),
    End,
}

/// Reads the next input: a line, a `\`-continued line, or a `"""` block.
fn read_input(lines: &mut impl BufRead, interactive: bool) -> anyhow::Result<Input> {
    let prompt = |p: &str| {
        if interactive {
            print!("{p}");
            let _ = std::io::stdout().flush();
        }
    };
    prompt(">>> ");
    let mut text = String::new();
    let mut block = false;
    loop {
        let mut line = String::new();
        if lines.read_line(&mut line)? == 0 {
            return Ok(if text.is_empty() {
                Input::End
            } else {
                Input::Turn(text)
            });
        }
        let line = line.strip_suffix('\n').unwrap_or(&line);
        let line = line.strip_suffix('\r').unwrap_or(line);
        if text.is_empty() && !block {
            if let Some(rest) = line.strip_prefix("\"\"\"") {
                if let Some(one) = rest.strip_suffix("\"\"\"") {
                    return Ok(Input::Turn(one.to_string()));
                }
                block = true;
                text.push_str(rest);
                prompt("... ");
                continue;
            }
            if let Some(cmd) = line.strip_prefix('/') {
                let (name, arg) = cmd.split_once(' ').unwrap_or((cmd, ""));
                return Ok(Input::Command(name.to_string(), arg.trim().to_string()));
            }
        }
        if block {
            if !text.is_empty() || line.is_empty() {
                text.push('\n');
            }
            if let Some(end) = line.strip_suffix("\"\"\"") {
                text.push_str(end);
                return Ok(Input::Turn(text.trim_start_matches('\n').to_string()));
            }
            text.push_str(line);
            prompt("... ");
        } else if let Some(cont) = line.strip_suffix('\\') {
            text.push_str(cont);
            text.push('\n');
            prompt("... ");
        } else {
            text.push_str(line);
            return Ok(Input::Turn(text));
        }
    }
}

/// How output is shown: content plain, reasoning dimmed (terminal) or hidden.
struct Display {
    show_reasoning: bool,
    color: bool,
    in_reasoning: bool,
}

impl Display {
    fn show(
        &mut self,
        out: &mut impl Write,
        events: Vec<Event>,
        reply: &mut Reply,
    ) -> anyhow::Result<()> {
        for e in events {
            match e {
                Event::Content(c) => {
                    self.leave_reasoning(out)?;
                    out.write_all(c.as_bytes())?;
                    reply.content.push_str(&c);
                }
                Event::Reasoning(r) => {
                    if self.show_reasoning {
                        if !self.in_reasoning && self.color {
                            out.write_all(b"\x1b[2m")?;
                        }
                        self.in_reasoning = true;
                        out.write_all(r.as_bytes())?;
                    }
                    reply.reasoning.push_str(&r);
                }
                Event::ToolCall(call) => {
                    self.leave_reasoning(out)?;
                    writeln!(out, "\n[tool call] {} {}", call.name, call.arguments)?;
                    reply.tool_calls.push(call);
                }
            }
        }
        out.flush()?;
        Ok(())
    }

    fn leave_reasoning(&mut self, out: &mut impl Write) -> anyhow::Result<()> {
        if self.in_reasoning {
            out.write_all(if self.color { b"\x1b[0m\n" } else { b"\n" })?;
            self.in_reasoning = false;
        }
        Ok(())
    }
}

#[derive(Default)]
struct Reply {
    content: String,
    reasoning: String,
    tool_calls: Vec<llamay_template::ToolCall>,
}

/// Everything a turn needs besides the conversation.
struct Session<'c, 'm> {
    ctx: &'c mut Context<'m>,
    tok: &'c Tokenizer,
    format: ChatFormat,
    kwargs: serde_json::Map<String, serde_json::Value>,
    params: SamplerParams,
    sampler: Option<Sampler>,
    limit: usize,
    ignore_eos: bool,
    /// `--draft-lookup` / `--draft-model`: lent to each answer's sampling (the draft
    /// model's cache follows the conversation from turn to turn).
    speculation: Speculation<'c>,
    /// Each answer is sampled under this grammar (`--json`, ...).
    grammar: Option<Bound>,
    display: Display,
    turn: usize,
}

impl Session<'_, '_> {
    /// Renders the conversation, reuses the cached prefix, prefills the rest and
    /// generates the assistant's answer, which joins the conversation.
    fn turn(&mut self, conv: &mut Conversation) -> anyhow::Result<()> {
        let n_ctx = self.ctx.kv().n_ctx();
        let prompt = self
            .format
            .render(&conv.messages(), None, true, self.kwargs.clone())?;
        let ids = self.format.encode(self.tok, &prompt);
        if ids.len() >= n_ctx {
            bail!(
                "the conversation is {} tokens, which does not fit the context of {n_ctx} (/clear, or raise -c)",
                ids.len()
            );
        }
        // The last prompt token is always decoded: its logits start the answer.
        let (seq, reused) = keep_shared_prefix(self.ctx, conv.seq, &ids)?;
        conv.seq = seq;
        self.turn += 1;
        let t0 = Instant::now();
        let logits = prefill(self.ctx, conv.seq, &ids[reused..], reused)?;
        let prefill_s = t0.elapsed().as_secs_f64();
        eprintln!(
            "[turn {}] prompt {} tokens: {} new, {reused} from the cache ({:.1} tok/s)",
            self.turn,
            ids.len(),
            ids.len() - reused,
            (ids.len() - reused) as f64 / prefill_s.max(1e-9)
        );

        let mut parser = OutputParser::new(self.format.output_format(&prompt));
        let mut decoder = StreamDecoder::rendering_special(self.tok);
        let mut reply = Reply::default();
        let mut sampling = Sampling {
            sampler: self
                .sampler
                .take()
                .unwrap_or_else(|| Sampler::new(self.params.clone())),
            history: ids.clone(),
            limit: self.limit,
            ignore_eos: self.ignore_eos,
            constraint: self.grammar.as_ref().map(Bound::start),
            speculation: std::mem::take(&mut self.speculation),
        };
        let mut out = std::io::stdout().lock();
        INTERRUPTED.store(false, Ordering::SeqCst);
        GENERATING.store(true, Ordering::SeqCst);
        let t1 = Instant::now();
        let display = &mut self.display;
        let result = sampling.run(self.ctx, conv.seq, self.tok, logits, |id| {
            let text = decoder.push(id)?;
            display.show(&mut out, parser.push(&text), &mut reply)?;
            Ok(if INTERRUPTED.load(Ordering::SeqCst) {
                Flow::Stop
            } else {
                Flow::Continue
            })
        });
        GENERATING.store(false, Ordering::SeqCst);
        self.sampler = Some(sampling.sampler);
        self.speculation = sampling.speculation;
        let (generated, stop) = result?;
        let mut events = parser.push(&decoder.finish());
        events.extend(parser.finish());
        display.show(&mut out, events, &mut reply)?;
        display.leave_reasoning(&mut out)?;
        writeln!(out)?;
        out.flush()?;
        let gen_s = t1.elapsed().as_secs_f64();
        eprintln!(
            "[turn {}] generation {generated} tokens ({:.1} tok/s), stop: {}",
            self.turn,
            generated as f64 / gen_s.max(1e-9),
            stop.as_str()
        );
        let mut answer = Message::new("assistant", &reply.content);
        answer.reasoning = (!reply.reasoning.is_empty()).then_some(reply.reasoning);
        answer.tool_calls = reply.tool_calls;
        conv.turns.push(answer);
        Ok(())
    }
}

/// `/save` files: a magic line, the transcript as one JSON line, then the KV snapshot
/// (which carries the model identity, the precision and its own checksum).
const SAVE_MAGIC: &[u8] = b"LLAMAYCHAT 1\n";
/// A transcript line longer than this is not one we wrote.
const MAX_TRANSCRIPT: usize = 64 << 20;

fn save(ctx: &mut Context<'_>, conv: &Conversation, path: &Path) -> anyhow::Result<()> {
    let transcript = serde_json::json!({
        "system": conv.system,
        "messages": conv.turns.iter().map(Message::to_openai).collect::<Vec<_>>(),
    });
    let mut bytes = SAVE_MAGIC.to_vec();
    bytes.extend_from_slice(transcript.to_string().as_bytes());
    bytes.push(b'\n');
    bytes.extend_from_slice(&ctx.save_sequence(conv.seq)?);
    // Written beside the target and renamed: a failed save never leaves half a file.
    let tmp = PathBuf::from(format!("{}.partial", path.display()));
    std::fs::write(&tmp, &bytes).with_context(|| format!("/save {}", path.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("/save {}", path.display()))?;
    Ok(())
}

fn load(ctx: &mut Context<'_>, conv: &mut Conversation, path: &Path) -> anyhow::Result<()> {
    let what = || format!("/load {}", path.display());
    let bytes = std::fs::read(path).with_context(what)?;
    let rest = bytes
        .strip_prefix(SAVE_MAGIC)
        .with_context(|| format!("{}: not a llamay chat save (no LLAMAYCHAT header)", what()))?;
    let nl = rest
        .iter()
        .take(MAX_TRANSCRIPT)
        .position(|&b| b == b'\n')
        .with_context(|| format!("{}: the transcript line is unterminated", what()))?;
    let t: serde_json::Value = serde_json::from_slice(&rest[..nl])
        .with_context(|| format!("{}: the transcript is not JSON", what()))?;
    let system = match &t["system"] {
        serde_json::Value::Null => None,
        serde_json::Value::String(s) => Some(s.clone()),
        _ => bail!("{}: the transcript's system is not a string", what()),
    };
    let turns = Message::list_from_json(&t["messages"]).with_context(what)?;
    // Checked in full (identity, precision, sizes, checksum) before anything changes.
    let seq = ctx.load_sequence(&rest[nl + 1..]).with_context(what)?;
    ctx.kv_mut().free(conv.seq)?;
    *conv = Conversation { system, turns, seq };
    Ok(())
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let path = &args.model.path()?;
    let limit = args.sampling.limit()?;
    let params = args.sampling.params()?;
    let kv = session::kv(&args.kv)?;
    let kwargs = chat::kwargs(args.chat_template_kwargs.as_deref())?;
    let rules = args.constraint.rules()?;
    let threads = session::threads(args.threads)?;
    let mapped = MappedModel::open(path)?;
    let gguf = mapped.parse()?;
    let (model, tok) = session::load(&mapped, &gguf, threads)?;
    session::require_logits(&model)?;
    let format = chat_format::require(args.chat_template.as_deref(), gguf.metadata(), &tok)?;
    let grammar = rules.map(|r| Bound::new(r, &tok)).transpose()?;
    let n_ctx = session::context(args.ctx_size, &model)?;
    let draft_file = speculate::open_draft_file(&args.sampling)?;
    let draft_params = speculate::DraftParams::new(&args.sampling, threads, kv, n_ctx)?;
    let draft = speculate::Draft::load(draft_file.as_ref(), draft_params, &tok)?;
    let mut ctx = args
        .device
        .context(&model, ContextParams::new(threads, kv, n_ctx))?;
    let interactive = std::io::stdin().is_terminal();
    catch_ctrl_c();
    if interactive {
        eprintln!(
            "llamay chat: {} ({n_ctx}-token context). /help for commands.",
            path.display()
        );
    }
    let mut conv = Conversation {
        system: args.system.clone(),
        turns: Vec::new(),
        seq: ctx.new_sequence(),
    };
    let mut session = Session {
        ctx: &mut ctx,
        tok: &tok,
        format,
        kwargs,
        params,
        sampler: None,
        limit,
        ignore_eos: args.sampling.ignore_eos,
        speculation: draft.speculation(&tok)?,
        grammar,
        display: Display {
            show_reasoning: args.show_reasoning,
            color: std::io::stdout().is_terminal(),
            in_reasoning: false,
        },
        turn: 0,
    };
    let mut input = std::io::stdin().lock();
    loop {
        match read_input(&mut input, interactive)? {
            Input::End => {
                if interactive {
                    println!();
                }
                return Ok(());
            }
            Input::Turn(text) if text.trim().is_empty() => {}
            Input::Turn(text) => {
                conv.turns.push(Message::new("user", &text));
                if let Err(e) = session.turn(&mut conv) {
                    // The turn did not happen: the conversation stays as it was.
                    conv.turns.pop();
                    if !interactive {
                        return Err(e);
                    }
                    eprintln!("error: {}", crate::out::one_line(&e));
                }
            }
            Input::Command(name, arg) => {
                let result = match name.as_str() {
                    "help" | "?" => {
                        println!("{HELP}");
                        Ok(())
                    }
                    "bye" | "exit" | "quit" => return Ok(()),
                    "clear" => {
                        conv.turns.clear();
                        session
                            .ctx
                            .kv_mut()
                            .free(conv.seq)
                            .map_err(anyhow::Error::from)
                            .map(|()| {
                                conv.seq = session.ctx.new_sequence();
                                eprintln!("[cleared]");
                            })
                    }
                    "system" => {
                        conv.system = (!arg.is_empty()).then_some(arg);
                        eprintln!(
                            "[system message {}]",
                            if conv.system.is_some() {
                                "set"
                            } else {
                                "removed"
                            }
                        );
                        Ok(())
                    }
                    "save" if !arg.is_empty() => {
                        save(session.ctx, &conv, Path::new(&arg)).map(|()| {
                            eprintln!("[saved {} turns to {arg}]", conv.turns.len());
                        })
                    }
                    "load" if !arg.is_empty() => {
                        load(session.ctx, &mut conv, Path::new(&arg)).map(|()| {
                            eprintln!(
                                "[loaded {} turns, {} cached tokens from {arg}]",
                                conv.turns.len(),
                                session.ctx.kv().len(conv.seq).unwrap_or(0)
                            );
                        })
                    }
                    "save" | "load" => Err(anyhow::anyhow!("/{name} FILE: give a file name")),
                    _ => Err(anyhow::anyhow!("unknown command /{name}; /help lists them")),
                };
                if let Err(e) = result {
                    if !interactive {
                        return Err(e);
                    }
                    eprintln!("error: {}", crate::out::one_line(&e));
                }
            }
        }
    }
}
