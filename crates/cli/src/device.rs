//! `--device cpu|vulkan[:N]|auto` (and `LLAMAY_DEVICE`): where a command's forward pass
//! runs. The CPU is the default until the device kernels are measured faster on a real
//! GPU; `auto` takes a discrete or integrated GPU when there is one and never a
//! CPU-type Vulkan device (lavapipe), which must be named. Whatever is chosen is said
//! in one line on stderr, with what stays on the CPU and why.

use anyhow::{Context as _, bail};
use llamay_engine::device::Device;
use llamay_engine::{Context, ContextParams, Model};

#[derive(clap::Args, Clone, Debug, Default)]
pub struct DeviceArg {
    /// Where the forward pass runs: cpu (the default), vulkan (the first usable Vulkan
    /// device), vulkan:N (device N of `llamay version`), auto (a GPU if there is one,
    /// else the CPU). Also LLAMAY_DEVICE.
    #[arg(long, value_name = "cpu|vulkan[:N]|auto")]
    pub device: Option<String>,
}

/// A parsed `--device`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    Cpu,
    Vulkan(Option<usize>),
    Auto,
}

pub fn parse(s: &str) -> anyhow::Result<Choice> {
    Ok(match s {
        "cpu" => Choice::Cpu,
        "auto" => Choice::Auto,
        "vulkan" => Choice::Vulkan(None),
        _ => match s.strip_prefix("vulkan:").map(str::parse::<usize>) {
            Some(Ok(n)) => Choice::Vulkan(Some(n)),
            _ => bail!(
                "--device {s}: use cpu, vulkan, vulkan:N (a device `llamay version` lists) or auto"
            ),
        },
    })
}

impl DeviceArg {
    /// The flag, else `LLAMAY_DEVICE`, else `LLAMAY_GPU` (docs/cli.md's
    /// `off|cuda|vulkan|metal`), else the CPU.
    pub fn choice(&self) -> anyhow::Result<Choice> {
        let env = |k: &str| std::env::var(k).ok().filter(|s| !s.is_empty());
        if let Some(s) = &self.device {
            return parse(s);
        }
        if let Some(s) = env("LLAMAY_DEVICE") {
            return parse(&s).context("LLAMAY_DEVICE");
        }
        match env("LLAMAY_GPU").as_deref() {
            None | Some("off") => Ok(Choice::Cpu),
            Some("vulkan") => Ok(Choice::Vulkan(None)),
            Some(other @ ("cuda" | "metal")) => {
                bail!(
                    "LLAMAY_GPU={other}: this build has no {other} backend (it has vulkan; off for the CPU)"
                )
            }
            Some(other) => {
                bail!("LLAMAY_GPU={other}: use off or vulkan (cuda and metal are not built yet)")
            }
        }
    }

    /// The device the choice names, opened; `None` for the CPU. A named device that
    /// cannot be opened is an error; `auto` without a GPU is the CPU, said in one line.
    pub fn open(&self) -> anyhow::Result<Option<Box<dyn Device>>> {
        let Some(index) = self.resolve()? else {
            return Ok(None);
        };
        Ok(Some(open_vulkan(index)?))
    }

    /// The Vulkan device index the choice comes to, or `None` for the CPU.
    #[cfg(target_family = "wasm")]
    pub fn resolve(&self) -> anyhow::Result<Option<usize>> {
        match self.choice()? {
            Choice::Cpu => Ok(None),
            Choice::Auto => {
                eprintln!("device: cpu (a wasm32 build has no GPU backend)");
                Ok(None)
            }
            Choice::Vulkan(_) => Err(crate::left_out::gpu("--device vulkan")),
        }
    }

    /// The Vulkan device index the choice comes to, or `None` for the CPU.
    #[cfg(not(target_family = "wasm"))]
    pub fn resolve(&self) -> anyhow::Result<Option<usize>> {
        let choice = self.choice()?;
        let index = match choice {
            Choice::Cpu => return Ok(None),
            Choice::Vulkan(Some(i)) => i,
            Choice::Vulkan(None) | Choice::Auto => {
                let devices = match llamay_vulkan::probe() {
                    Ok(d) => d,
                    Err(e) if choice == Choice::Auto => {
                        eprintln!("device: cpu ({e})");
                        return Ok(None);
                    }
                    Err(e) => bail!("--device vulkan: {e}"),
                };
                let pick = match choice {
                    Choice::Auto => llamay_vulkan::pick_auto(&devices),
                    _ => devices.iter().find(|d| d.unusable.is_none()),
                };
                match pick {
                    Some(d) => d.index,
                    None if choice == Choice::Auto => {
                        eprintln!(
                            "device: cpu (no discrete or integrated GPU; a CPU-type Vulkan device is used only when named)"
                        );
                        return Ok(None);
                    }
                    None => {
                        bail!("--device vulkan: no usable Vulkan device (see `llamay version`)")
                    }
                }
            }
        };
        Ok(Some(index))
    }

    /// A context for `model` on the chosen device (the CPU where none is chosen).
    pub fn context<'m>(
        &self,
        model: &'m Model<'m>,
        params: ContextParams,
    ) -> anyhow::Result<Context<'m>> {
        match self.open()? {
            None => Ok(model.context(params)?),
            Some(dev) => context_on(model, params, dev),
        }
    }
}

/// Opens Vulkan device `index`: refused in a wasm32 build.
#[cfg(target_family = "wasm")]
pub fn open_vulkan(index: usize) -> anyhow::Result<Box<dyn Device>> {
    Err(crate::left_out::gpu(&format!("--device vulkan:{index}")))
}

/// Opens Vulkan device `index`.
#[cfg(not(target_family = "wasm"))]
pub fn open_vulkan(index: usize) -> anyhow::Result<Box<dyn Device>> {
    let dev = llamay_vulkan::VulkanDevice::open(index)
        .with_context(|| format!("--device vulkan:{index}"))?;
    Ok(Box::new(dev))
}

/// A context on `dev`, announced in one line (with what stays on the CPU), or an error
/// naming why the device does not run the model.
pub fn context_on<'m>(
    model: &'m Model<'m>,
    params: ContextParams,
    dev: Box<dyn Device>,
) -> anyhow::Result<Context<'m>> {
    let declined = model.device_declined_matrices(&*dev);
    let name = dev.describe();
    let ctx = model.context_on(params, dev)?;
    if declined.is_empty() {
        eprintln!("device: {name}");
    } else {
        let mut reasons: Vec<&str> = declined
            .iter()
            .filter_map(|d| d.split_once(": ").map(|(_, r)| r))
            .collect();
        reasons.sort_unstable();
        reasons.dedup();
        eprintln!(
            "device: {name}; {} of the model's matrices run on the CPU ({})",
            declined.len(),
            reasons.join("; ")
        );
    }
    Ok(ctx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_parse_and_bad_ones_name_the_forms() {
        assert_eq!(parse("cpu").unwrap(), Choice::Cpu);
        assert_eq!(parse("auto").unwrap(), Choice::Auto);
        assert_eq!(parse("vulkan").unwrap(), Choice::Vulkan(None));
        assert_eq!(parse("vulkan:2").unwrap(), Choice::Vulkan(Some(2)));
        for bad in ["gpu", "vulkan:", "vulkan:x", "cuda"] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains(bad) && e.contains("vulkan:N"), "{e}");
        }
    }
}
