//! MXNet's binary NDArray file format (`mx.nd.save` / `mx.nd.load`, `.params` checkpoints).
//!
//! Layout (little-endian): u64 magic 0x112, u64 reserved, u64 count, then each array, then u64
//! name count and each name as u64 length + bytes. An array is u32 magic (V2 0xF993FAC9 with a
//! storage type; V3 0xF993FACA for NumPy-shape 0-d arrays; V1 0xF993FAC8 without storage type;
//! files from before 0.9 have no magic and u32 dims), the shape as u32 ndim + i64 dims, the
//! context as two i32, the i32 dtype flag, then the raw elements.

use std::io::Write;
use std::path::Path;

use crate::base::{Context, DType, Shape};
use crate::error::Result;
use crate::ndarray::NDArray;

const LIST_MAGIC: u64 = 0x112;
const V1_MAGIC: u32 = 0xF993_FAC8;
const V2_MAGIC: u32 = 0xF993_FAC9;
const V3_MAGIC: u32 = 0xF993_FACA;

/// Serialize arrays (and their names, empty for a list) in MXNet's format.
pub fn to_bytes(arrays: &[NDArray], names: &[String]) -> Result<Vec<u8>> {
    if !names.is_empty() && names.len() != arrays.len() {
        crate::bail!(Value, "save: {} names for {} arrays", names.len(), arrays.len());
    }
    let mut out = Vec::with_capacity(64 + arrays.iter().map(|a| a.nbytes() + 64).sum::<usize>());
    out.extend_from_slice(&LIST_MAGIC.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    out.extend_from_slice(&(arrays.len() as u64).to_le_bytes());
    for a in arrays {
        let zero_d = a.shape().ndim() == 0;
        // MXNet 1.x writes V2; a 0-d array only exists under NumPy semantics, which use V3.
        out.extend_from_slice(&(if zero_d { V3_MAGIC } else { V2_MAGIC }).to_le_bytes());
        out.extend_from_slice(&0i32.to_le_bytes()); // default (dense) storage
        out.extend_from_slice(&(a.shape().ndim() as u32).to_le_bytes());
        for &d in a.shape().dims() {
            out.extend_from_slice(&(d as i64).to_le_bytes());
        }
        if a.size() == 0 && !zero_d {
            // MXNet stops after the shape for arrays without elements.
            continue;
        }
        // Data is always written from host memory, which MXNet records as cpu(0).
        out.extend_from_slice(&Context::cpu(0).device_type.code().to_le_bytes());
        out.extend_from_slice(&0i32.to_le_bytes());
        out.extend_from_slice(&a.dtype().flag().to_le_bytes());
        out.extend_from_slice(&a.to_bytes()?);
    }
    out.extend_from_slice(&(names.len() as u64).to_le_bytes());
    for n in names {
        out.extend_from_slice(&(n.len() as u64).to_le_bytes());
        out.extend_from_slice(n.as_bytes());
    }
    Ok(out)
}

/// Write a file atomically: a crash or error midway never leaves a truncated file at `path`.
pub fn save(path: &Path, arrays: &[NDArray], names: &[String]) -> Result<()> {
    let bytes = to_bytes(arrays, names)?;
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let file_name = path.file_name().ok_or_else(|| crate::err!(Io, "save: '{}' is not a file path", path.display()))?;
    let tmp = dir.join(format!(".{}.tmp{}", file_name.to_string_lossy(), std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        crate::err!(Io, "save: cannot write '{}': {e}", path.display())
    })
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len()).ok_or_else(|| {
            crate::err!(Io, "corrupt NDArray file: unexpected end of data reading {what} at byte {} (file has {} bytes)", self.pos, self.bytes.len())
        })?;
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn i32(&mut self, what: &str) -> Result<i32> {
        Ok(i32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }
    fn i64(&mut self, what: &str) -> Result<i64> {
        Ok(i64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }
    /// A count that must fit in what is left of the file (each item needing `min_item` bytes).
    fn count(&mut self, what: &str, min_item: usize) -> Result<usize> {
        let n = self.u64(what)?;
        let left = (self.bytes.len() - self.pos) as u64;
        if n.saturating_mul(min_item as u64) > left {
            crate::bail!(Io, "corrupt NDArray file: {what} is {n}, more than the remaining {left} bytes can hold");
        }
        Ok(n as usize)
    }

    fn shape(&mut self, ndim: u32, dims_64bit: bool) -> Result<Shape> {
        if ndim > 32 {
            crate::bail!(Io, "corrupt NDArray file: {ndim} dimensions at byte {}", self.pos);
        }
        let mut dims = Vec::with_capacity(ndim as usize);
        for _ in 0..ndim {
            let d = if dims_64bit { self.i64("a dimension")? } else { self.u32("a dimension")? as i64 };
            if d < 0 {
                crate::bail!(Io, "corrupt NDArray file: negative dimension {d}");
            }
            dims.push(d as usize);
        }
        Ok(Shape::new(dims))
    }

    fn array(&mut self) -> Result<NDArray> {
        let magic = self.u32("an array header")?;
        let (shape, zero_d_is_scalar) = match magic {
            V2_MAGIC | V3_MAGIC => {
                let stype = self.i32("the storage type")?;
                if stype != 0 {
                    crate::bail!(Io, "sparse NDArrays (storage type {stype}) are not supported yet");
                }
                let ndim = self.u32("the number of dimensions")?;
                (self.shape(ndim, true)?, magic == V3_MAGIC)
            }
            V1_MAGIC => {
                let ndim = self.u32("the number of dimensions")?;
                (self.shape(ndim, true)?, false)
            }
            legacy_ndim => (self.shape(legacy_ndim, false)?, false),
        };
        if shape.ndim() == 0 && !zero_d_is_scalar || (shape.size() == 0 && shape.ndim() > 0) {
            // An empty (or, before NumPy semantics, undefined) array: nothing else is stored.
            return NDArray::empty(shape, DType::F32, Context::cpu(0));
        }
        let dev_type = self.i32("the device type")?;
        let _dev_id = self.i32("the device id")?;
        crate::base::DeviceType::from_code(dev_type).map_err(|e| crate::err!(Io, "corrupt NDArray file: {}", e.message))?;
        let flag = self.i32("the dtype")?;
        let dtype = DType::from_flag(flag).map_err(|e| crate::err!(Io, "corrupt NDArray file: {}", e.message))?;
        let nbytes = shape
            .size()
            .checked_mul(dtype.size())
            .ok_or_else(|| crate::err!(Io, "corrupt NDArray file: shape {shape} is too large"))?;
        let data = self.take(nbytes, "array data")?;
        // Arrays load onto the CPU; `as_in_context` moves them.
        NDArray::from_bytes(shape, dtype, Context::cpu(0), data)
    }
}

/// Parse MXNet's format: the arrays and their names (empty when saved as a list).
pub fn from_bytes(bytes: &[u8]) -> Result<(Vec<NDArray>, Vec<String>)> {
    let mut r = Reader { bytes, pos: 0 };
    let magic = r.u64("the file header")?;
    if magic != LIST_MAGIC {
        crate::bail!(Io, "not an MXNet NDArray file: header magic is {magic:#x}, expected 0x112");
    }
    r.u64("the reserved field")?;
    let n = r.count("the number of arrays", 4)?;
    let arrays = (0..n).map(|_| r.array()).collect::<Result<Vec<_>>>()?;
    let k = r.count("the number of names", 8)?;
    let mut names = Vec::with_capacity(k);
    for _ in 0..k {
        let len = r.count("a name length", 1)?;
        let raw = r.take(len, "a name")?;
        names.push(String::from_utf8(raw.to_vec()).map_err(|_| crate::err!(Io, "corrupt NDArray file: a name is not UTF-8"))?);
    }
    if !names.is_empty() && names.len() != arrays.len() {
        crate::bail!(Io, "corrupt NDArray file: {} names for {} arrays", names.len(), arrays.len());
    }
    Ok((arrays, names))
}

pub fn load(path: &Path) -> Result<(Vec<NDArray>, Vec<String>)> {
    let bytes = std::fs::read(path).map_err(|e| crate::err!(Io, "load: cannot read '{}': {e}", path.display()))?;
    from_bytes(&bytes).map_err(|e| e.context(format!("load '{}'", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_is_byte_identical() {
        let a = NDArray::from_vec(Shape::new(vec![2, 3]), &[1f32, 2., 3., 4., 5., 6.], Context::cpu(0)).unwrap();
        let b = NDArray::from_vec(Shape::new(vec![4]), &[1i64, -2, 3, 4], Context::cpu(0)).unwrap();
        let bytes = to_bytes(&[a, b], &["arg:a".into(), "aux:b".into()]).unwrap();
        let (arrays, names) = from_bytes(&bytes).unwrap();
        assert_eq!(names, vec!["arg:a", "aux:b"]);
        assert_eq!(arrays[1].to_vec::<i64>().unwrap(), vec![1, -2, 3, 4]);
        assert_eq!(to_bytes(&arrays, &names).unwrap(), bytes);
    }

    #[test]
    fn every_truncation_is_an_error_not_a_crash() {
        let a = NDArray::from_vec(Shape::new(vec![3]), &[1f64, 2., 3.], Context::cpu(0)).unwrap();
        let bytes = to_bytes(&[a], &["x".into()]).unwrap();
        for cut in 0..bytes.len() {
            assert!(from_bytes(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = bytes.clone();
        bad[24] ^= 0xFF; // array magic
        assert!(from_bytes(&bad).is_err());
    }
}
