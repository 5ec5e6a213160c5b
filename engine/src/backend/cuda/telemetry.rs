//! GPU telemetry through NVML: the device's name, memory, utilisation,
//! temperature and power. NVML is loaded at run time
//! (`libnvidia-ml.so.1`); without it there is no telemetry, and a warning.

use crate::backend::{DeviceReading, DeviceTelemetry};
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use std::sync::Arc;

/// Reads one GPU, named by UUID (CUDA's ordinals may be renumbered).
pub(super) struct Nvml {
    nvml: nvml_wrapper::Nvml,
    uuid: String,
}

impl Nvml {
    /// Telemetry of the GPU `uuid` (`GPU-…`), or `None` (logged) without NVML.
    pub(super) fn open(uuid: String) -> Option<Arc<dyn DeviceTelemetry>> {
        match nvml_wrapper::Nvml::init() {
            Ok(nvml) => Some(Arc::new(Self { nvml, uuid })),
            Err(e) => {
                tracing::warn!("no GPU telemetry (NVML: {e})");
                None
            }
        }
    }
}

impl DeviceTelemetry for Nvml {
    fn read(&self) -> Option<DeviceReading> {
        let d = self.nvml.device_by_uuid(self.uuid.as_str()).ok()?;
        let memory = d.memory_info().ok()?;
        Some(DeviceReading {
            name: d.name().unwrap_or_default(),
            memory_used: memory.used,
            memory_total: memory.total,
            utilization: d.utilization_rates().ok().map(|u| u.gpu),
            temperature: d.temperature(TemperatureSensor::Gpu).ok(),
            power_watts: d.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
        })
    }
}
