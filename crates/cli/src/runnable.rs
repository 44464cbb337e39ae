//! Would this build run the file? Until the engine exists this is the whole answer;
//! the engine's strict loader will take it over (design invariant 4: only the loader
//! reads metadata keys for a model's meaning).

use llamay_gguf::Model;

/// The verdict `info` prints.
pub struct Assessment {
    pub runnable: bool,
    pub refusal: Option<String>,
    /// Tensors the loader would leave unread.
    pub unread: Vec<String>,
}

/// Architectures this build can run. Empty until the engine lands.
pub const RUNNABLE_ARCHITECTURES: &[&str] = &[];

pub fn assess(model: &Model<'_>) -> Assessment {
    let refuse = |why: String| Assessment {
        runnable: false,
        refusal: Some(why),
        unread: Vec::new(),
    };
    if model.big_endian() {
        return refuse(
            "the file is big-endian; llamay runs little-endian files (convert with gguf-py's gguf_convert_endian)"
                .into(),
        );
    }
    let refused: Vec<_> = model.tensors().filter(|t| !t.ty.is_readable()).collect();
    if let Some(first) = refused.first() {
        let why = first.ty.refusal().unwrap_or_default();
        return refuse(format!(
            "{} of {} tensors cannot be read, first '{}': {why}",
            refused.len(),
            model.tensor_count(),
            first.name
        ));
    }
    let arch = match model.metadata().architecture() {
        Ok(Some(a)) => a,
        Ok(None) if model.tensor_count() == 0 => {
            return refuse(
                "the file holds no tensors and no general.architecture (a vocabulary-only file)"
                    .into(),
            );
        }
        Ok(None) => return refuse("the file declares no general.architecture".into()),
        Err(e) => return refuse(e.to_string()),
    };
    if !RUNNABLE_ARCHITECTURES.contains(&arch) {
        let works = if RUNNABLE_ARCHITECTURES.is_empty() {
            "this build has no inference engine yet; info, dump and the container tools work"
                .to_string()
        } else {
            format!(
                "runnable architectures: {}",
                RUNNABLE_ARCHITECTURES.join(" ")
            )
        };
        return refuse(format!(
            "architecture '{arch}' is not implemented in this build ({works})"
        ));
    }
    Assessment {
        runnable: true,
        refusal: None,
        unread: Vec::new(),
    }
}
