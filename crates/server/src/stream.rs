//! Streaming responses: the engine's events for one request turned into NDJSON lines
//! (Ollama) or server-sent events ending in `data: [DONE]` (OpenAI). The body owns the
//! request's receiver, so a client that goes away drops it, and the engine drops the
//! request at its next step.

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::Response;
use bytes::Bytes;
use serde_json::Value;
use std::convert::Infallible;
use tokio::sync::mpsc::UnboundedReceiver;

#[derive(Clone, Copy)]
pub enum Framing {
    NdJson,
    Sse,
    /// Server-sent events named by each object's `type` (`event: TYPE`), with no
    /// `[DONE]`: OpenAI's Responses API.
    SseTyped,
}

/// What a request's converter makes of one event: objects to send, and whether the
/// stream is over.
pub struct Out {
    pub objects: Vec<Value>,
    pub end: bool,
}

/// The last object of a stream whose request failed (`why`), or whose engine went
/// away before finishing it (`None`), in the API's error shape.
pub fn failed(why: Option<String>, openai: bool) -> Out {
    let message = why.unwrap_or_else(|| "the engine stopped".into());
    let object = if openai {
        serde_json::json!({"error": {"message": message, "type": "server_error"}})
    } else {
        serde_json::json!({ "error": message })
    };
    Out {
        objects: vec![object],
        end: true,
    }
}

/// A streaming response: `convert` turns every event (and `None` if the engine went
/// away without finishing) into the objects sent.
pub fn respond<S: Send + 'static, T: Send + 'static>(
    framing: Framing,
    rx: UnboundedReceiver<T>,
    state: S,
    convert: impl FnMut(&mut S, Option<T>) -> Out + Send + 'static,
) -> Response {
    struct St<S, F, T> {
        rx: UnboundedReceiver<T>,
        state: S,
        convert: F,
        ended: bool,
        framing: Framing,
    }
    let st = St {
        rx,
        state,
        convert,
        ended: false,
        framing,
    };
    let stream = futures_util::stream::unfold(st, |mut st| async move {
        loop {
            if st.ended {
                return None;
            }
            let ev = st.rx.recv().await;
            let closed = ev.is_none();
            let out = (st.convert)(&mut st.state, ev);
            st.ended = out.end || closed;
            let mut buf = Vec::new();
            for o in &out.objects {
                match st.framing {
                    Framing::NdJson => {
                        serde_json::to_writer(&mut buf, o).expect("a JSON value serialises");
                        buf.push(b'\n');
                    }
                    Framing::Sse => {
                        buf.extend_from_slice(b"data: ");
                        serde_json::to_writer(&mut buf, o).expect("a JSON value serialises");
                        buf.extend_from_slice(b"\n\n");
                    }
                    Framing::SseTyped => {
                        let name = o["type"].as_str().unwrap_or("error");
                        buf.extend_from_slice(format!("event: {name}\ndata: ").as_bytes());
                        serde_json::to_writer(&mut buf, o).expect("a JSON value serialises");
                        buf.extend_from_slice(b"\n\n");
                    }
                }
            }
            if st.ended && matches!(st.framing, Framing::Sse) {
                buf.extend_from_slice(b"data: [DONE]\n\n");
            }
            if !buf.is_empty() {
                return Some((Ok::<_, Infallible>(Bytes::from(buf)), st));
            }
        }
    });
    let mut r = Response::new(Body::from_stream(stream));
    let ct = match framing {
        Framing::NdJson => "application/x-ndjson",
        Framing::Sse | Framing::SseTyped => "text/event-stream",
    };
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}
