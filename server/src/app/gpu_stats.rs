//! Device telemetry on `/metrics` as `spindle_gpu_*` gauges. The engine's
//! backend provides the readings (NVML on a GPU); `serve` installs its
//! reader at start-up, and without one there are no gauges.

use spindle_engine::runner::DeviceTelemetry;
use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};

pub use spindle_engine::runner::DeviceReading as GpuReading;

static TELEMETRY: OnceLock<Arc<dyn DeviceTelemetry>> = OnceLock::new();

/// Starts reading the device through `telemetry` (logs its first reading).
pub fn install(telemetry: Arc<dyn DeviceTelemetry>) {
    match telemetry.read() {
        Some(r) => tracing::info!(
            "GPU {}: {:.1} of {:.1} GiB used, {:?}% busy, {:?} °C, {:?} W",
            r.name,
            r.memory_used as f64 / f64::from(1u32 << 30),
            r.memory_total as f64 / f64::from(1u32 << 30),
            r.utilization,
            r.temperature,
            r.power_watts
        ),
        None => tracing::warn!("the device telemetry has no reading"),
    }
    let _ = TELEMETRY.set(telemetry);
}

/// The device now, when telemetry is installed.
pub fn read() -> Option<GpuReading> {
    TELEMETRY.get()?.read()
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
