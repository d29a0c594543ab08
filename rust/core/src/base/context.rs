//! Devices, with MXNet's device-type codes (stored in `.params` files).

use crate::error::Result;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceType {
    Cpu,
    Gpu,
    CpuPinned,
    CpuShared,
}

impl DeviceType {
    pub fn code(self) -> i32 {
        match self {
            DeviceType::Cpu => 1,
            DeviceType::Gpu => 2,
            DeviceType::CpuPinned => 3,
            DeviceType::CpuShared => 5,
        }
    }
    pub fn from_code(code: i32) -> Result<Self> {
        Ok(match code {
            1 => DeviceType::Cpu,
            2 => DeviceType::Gpu,
            3 => DeviceType::CpuPinned,
            5 => DeviceType::CpuShared,
            _ => crate::bail!(Value, "unknown device type code {code}"),
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            DeviceType::Cpu => "cpu",
            DeviceType::Gpu => "gpu",
            DeviceType::CpuPinned => "cpu_pinned",
            DeviceType::CpuShared => "cpu_shared",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Context {
    pub device_type: DeviceType,
    pub device_id: i32,
}

impl Context {
    pub const fn cpu(device_id: i32) -> Self {
        Context { device_type: DeviceType::Cpu, device_id }
    }
    pub const fn gpu(device_id: i32) -> Self {
        Context { device_type: DeviceType::Gpu, device_id }
    }
    /// Host memory of any flavour (plain, pinned, shared) is addressable by CPU kernels.
    pub fn is_host(&self) -> bool {
        self.device_type != DeviceType::Gpu
    }
    /// Parse MXNet's textual form, `cpu(0)`, `gpu(1)`, `cpu_pinned(0)`.
    pub fn parse(text: &str) -> Result<Self> {
        let text = text.trim();
        let (kind, rest) = text.split_once('(').ok_or_else(|| crate::err!(Value, "invalid context '{text}', expected e.g. cpu(0)"))?;
        let id: i32 = rest.trim_end_matches(')').trim().parse().map_err(|_| crate::err!(Value, "invalid context '{text}', expected e.g. cpu(0)"))?;
        let device_type = match kind {
            "cpu" => DeviceType::Cpu,
            "gpu" => DeviceType::Gpu,
            "cpu_pinned" => DeviceType::CpuPinned,
            "cpu_shared" => DeviceType::CpuShared,
            _ => crate::bail!(Value, "invalid context '{text}', expected cpu, gpu or cpu_pinned"),
        };
        Ok(Context { device_type, device_id: id })
    }
}

impl Default for Context {
    fn default() -> Self {
        Context::cpu(0)
    }
}

impl std::fmt::Display for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}({})", self.device_type.name(), self.device_id)
    }
}
