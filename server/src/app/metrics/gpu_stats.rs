//! Device telemetry on `/metrics` as `spindle_gpu_*` gauges. The engine's
//! backend provides the readings (NVML on a GPU); `serve` installs its
//! reader at start-up, and without one there are no gauges.

use spindle_engine::runner::DeviceTelemetry;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};
use std::borrow::Cow;
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

/// Adds the `spindle_gpu_*` gauges for `reading`, labelled with the GPU's
/// name; values NVML could not read are left out.
pub fn register(r: &mut Registry, reading: &GpuReading) {
    let gpu = r.sub_registry_with_label((Cow::Borrowed("gpu"), Cow::Owned(crate::app::metrics::counters::label_value(&reading.name))));
    for (metric, help, unit, value) in [
        ("spindle_gpu_memory_used", "GPU memory in use", Unit::Bytes, Some(reading.memory_used as f64)),
        ("spindle_gpu_memory_total", "GPU memory on the device", Unit::Bytes, Some(reading.memory_total as f64)),
        ("spindle_gpu_utilization", "GPU busy time in the last sample period", Unit::Other("percent".into()), reading.utilization.map(f64::from)),
        ("spindle_gpu_temperature", "GPU core temperature", Unit::Celsius, reading.temperature.map(f64::from)),
        ("spindle_gpu_power", "GPU board power", Unit::Other("watts".into()), reading.power_watts),
    ] {
        if let Some(value) = value {
            gpu.register_with_unit(metric, help, unit, ConstGauge::new(value));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_render_as_labelled_gauges() -> Result<(), String> {
        let r = GpuReading { name: "NVIDIA H200".into(), memory_used: 1 << 30, memory_total: 141 << 30, utilization: Some(87), temperature: None, power_watts: Some(412.5) };
        let mut registry = Registry::default();
        register(&mut registry, &r);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).map_err(|e| e.to_string())?;
        assert!(out.contains("spindle_gpu_memory_used_bytes{gpu=\"NVIDIA H200\"} 1073741824.0"), "{out}");
        assert!(out.contains("spindle_gpu_utilization_percent{gpu=\"NVIDIA H200\"} 87.0"), "{out}");
        assert!(out.contains("spindle_gpu_power_watts{gpu=\"NVIDIA H200\"} 412.5"), "{out}");
        assert!(!out.contains("temperature"), "an unreadable value is left out, not reported as 0");
        assert_eq!(out.matches("# TYPE").count(), 4);
        Ok(())
    }

    #[test]
    fn without_telemetry_there_is_no_reading() {
        if TELEMETRY.get().is_none() {
            assert_eq!(read(), None);
        }
    }
}
