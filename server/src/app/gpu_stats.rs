//! GPU telemetry through NVML (feature `cuda`): the device's name, memory,
//! utilisation, temperature and power, logged at start-up and exported on
//! `/metrics` as `spindle_gpu_*` gauges. Installed by `serve` when the model
//! runs on a GPU; NVML is loaded at run time (`libnvidia-ml.so.1`) and its
//! absence is a logged warning, never a failure.

use std::fmt::Write as _;
use std::sync::OnceLock;

/// One reading of the device.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuReading {
    /// Device name.
    pub name: String,
    /// Memory in use, bytes.
    pub memory_used: u64,
    /// Memory on the device, bytes.
    pub memory_total: u64,
    /// Busy time of the last sample period, percent (when readable).
    pub utilization: Option<u32>,
    /// Core temperature, °C (when readable).
    pub temperature: Option<u32>,
    /// Board power, watts (when readable).
    pub power_watts: Option<f64>,
}

#[cfg(feature = "cuda")]
struct Telemetry {
    nvml: nvml_wrapper::Nvml,
    /// NVML's name for the device (CUDA's ordinals may be renumbered).
    uuid: String,
}

#[cfg(feature = "cuda")]
static TELEMETRY: OnceLock<Telemetry> = OnceLock::new();
#[cfg(not(feature = "cuda"))]
static TELEMETRY: OnceLock<()> = OnceLock::new();

/// Starts reading the GPU with `uuid` (`GPU-…`; logs its first reading, or
/// why it cannot).
pub fn install(uuid: &str) {
    #[cfg(feature = "cuda")]
    match nvml_wrapper::Nvml::init() {
        Ok(nvml) => {
            let _ = TELEMETRY.set(Telemetry { nvml, uuid: uuid.to_string() });
            match read() {
                Some(r) => tracing::info!(
                    "GPU {uuid}: {} — {:.1} of {:.1} GiB used, {:?}% busy, {:?} °C, {:?} W",
                    r.name,
                    r.memory_used as f64 / f64::from(1u32 << 30),
                    r.memory_total as f64 / f64::from(1u32 << 30),
                    r.utilization,
                    r.temperature,
                    r.power_watts
                ),
                None => tracing::warn!("NVML has no reading for GPU {uuid}"),
            }
        }
        Err(e) => tracing::warn!("no GPU telemetry (NVML: {e})"),
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (uuid, &TELEMETRY);
    }
}

/// The device now, when telemetry is installed.
pub fn read() -> Option<GpuReading> {
    #[cfg(feature = "cuda")]
    {
        use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
        let t = TELEMETRY.get()?;
        let d = t.nvml.device_by_uuid(t.uuid.as_str()).ok()?;
        let memory = d.memory_info().ok()?;
        Some(GpuReading {
            name: d.name().unwrap_or_default(),
            memory_used: memory.used,
            memory_total: memory.total,
            utilization: d.utilization_rates().ok().map(|u| u.gpu),
            temperature: d.temperature(TemperatureSensor::Gpu).ok(),
            power_watts: d.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
        })
    }
    #[cfg(not(feature = "cuda"))]
    {
        None
    }
}

/// The `spindle_gpu_*` gauges for `reading` (Prometheus text); values NVML
/// could not read are left out.
pub fn render(out: &mut String, reading: &GpuReading) {
    let name = reading.name.replace(['\\', '"'], "");
    for (metric, help, value) in [
        ("spindle_gpu_memory_used_bytes", "GPU memory in use.", Some(reading.memory_used as f64)),
        ("spindle_gpu_memory_total_bytes", "GPU memory on the device.", Some(reading.memory_total as f64)),
        ("spindle_gpu_utilization_percent", "GPU busy time in the last sample period.", reading.utilization.map(f64::from)),
        ("spindle_gpu_temperature_celsius", "GPU core temperature.", reading.temperature.map(f64::from)),
        ("spindle_gpu_power_watts", "GPU board power.", reading.power_watts),
    ] {
        if let Some(value) = value {
            let _ = writeln!(out, "# HELP {metric} {help}\n# TYPE {metric} gauge\n{metric}{{gpu=\"{name}\"}} {value}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_render_as_labelled_gauges() {
        let r = GpuReading { name: "NVIDIA H200".into(), memory_used: 1 << 30, memory_total: 141 << 30, utilization: Some(87), temperature: None, power_watts: Some(412.5) };
        let mut out = String::new();
        render(&mut out, &r);
        assert!(out.contains("spindle_gpu_memory_used_bytes{gpu=\"NVIDIA H200\"} 1073741824"), "{out}");
        assert!(out.contains("spindle_gpu_utilization_percent{gpu=\"NVIDIA H200\"} 87"));
        assert!(out.contains("spindle_gpu_power_watts{gpu=\"NVIDIA H200\"} 412.5"));
        assert!(!out.contains("temperature"), "an unreadable value is left out, not reported as 0");
        assert_eq!(out.matches("# TYPE").count(), 4);
    }

    #[test]
    fn without_telemetry_there_is_no_reading() {
        if TELEMETRY.get().is_none() {
            assert_eq!(read(), None);
        }
    }
}
