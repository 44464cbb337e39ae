//! The CLI's side of chat formats (the format itself is `llamay_template::format`):
//! `--chat-template-kwargs`.

use anyhow::bail;

/// `--chat-template-kwargs '{"enable_thinking": false}'`: a JSON object of template variables.
pub fn kwargs(flag: Option<&str>) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
    match flag {
        None => Ok(serde_json::Map::new()),
        Some(s) => match serde_json::from_str(s) {
            Ok(serde_json::Value::Object(m)) => Ok(m),
            Ok(_) => bail!(
                "--chat-template-kwargs: give a JSON object, e.g. '{{\"enable_thinking\": false}}'"
            ),
            Err(e) => bail!("--chat-template-kwargs is not JSON: {e}"),
        },
    }
}
