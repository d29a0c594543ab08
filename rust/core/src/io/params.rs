//! MXNet's binary NDArray file format (`mx.nd.save` / `mx.nd.load`, `.params` checkpoints).
//!
//! Layout (little-endian): u64 magic 0x112, u64 reserved, u64 count, then each array, then u64
//! name count and each name as u64 length + bytes. An array is u32 magic (V2 0xF993FAC9 with a
//! storage type; V3 0xF993FACA for NumPy-shape 0-d arrays; V1 0xF993FAC8 without storage type;
//! files from before 0.9 have no magic and u32 dims), the shape as u32 ndim + i64 dims, the
//! context as two i32, the i32 dtype flag, then the raw elements.

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

/// Write a file so that a failure midway never leaves a truncated file at `path` (see
/// [`super::file::write_file`] for links, devices and FIFOs).
pub fn save(path: &Path, arrays: &[NDArray], names: &[String]) -> Result<()> {
    let bytes = to_bytes(arrays, names)?;
    super::file::write_file(path, &bytes).map_err(|e| e.context("save"))
}

/// The largest number of dimensions a valid file holds (MXNet's own limit is 32).
const MAX_DIMS: u32 = 32;

/// Reads MXNet's format from memory. Every count read from the file is checked against the bytes
/// that remain before anything is allocated for it, so a corrupt or hostile file costs at most
/// its own size in memory and fails with the offset of the first value that cannot be right.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// The error for a value at byte `at` that a valid file cannot hold.
    fn corrupt(&self, at: usize, detail: impl std::fmt::Display) -> crate::error::Error {
        crate::err!(Io, "corrupt NDArray file or not an MXNet NDArray file: at byte {at} of {}, {detail}", self.bytes.len())
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let bytes = self.bytes;
        let slice = self.pos.checked_add(n).and_then(|end| bytes.get(self.pos..end));
        let Some(slice) = slice else {
            let left = bytes.len() - self.pos;
            return Err(self.corrupt(self.pos, format_args!("expected {what} ({n} bytes) but only {left} bytes remain")));
        };
        self.pos += n;
        Ok(slice)
    }
    fn array_of<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array_of(what)?))
    }
    fn i32(&mut self, what: &str) -> Result<i32> {
        Ok(i32::from_le_bytes(self.array_of(what)?))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array_of(what)?))
    }
    fn i64(&mut self, what: &str) -> Result<i64> {
        Ok(i64::from_le_bytes(self.array_of(what)?))
    }
    /// A count of items that each take at least `min_item_bytes`: it must fit in what is left of
    /// the file, which bounds every allocation made for it.
    fn count(&mut self, what: &str, min_item_bytes: usize) -> Result<usize> {
        let at = self.pos;
        let n = self.u64(what)?;
        self.bounded(n, at, what, min_item_bytes)
    }
    /// `n`, read at byte `at`, when that many items of at least `min_item_bytes` fit in the rest.
    fn bounded(&self, n: u64, at: usize, what: &str, min_item_bytes: usize) -> Result<usize> {
        let left = self.bytes.len() - self.pos;
        let fits = usize::try_from(n).ok().filter(|&n| n.checked_mul(min_item_bytes).is_some_and(|b| b <= left));
        fits.ok_or_else(|| {
            self.corrupt(at, format_args!("{what} is {n}, but the {left} bytes that remain hold at most {}", left / min_item_bytes.max(1)))
        })
    }

    /// `ndim` dimensions, each an i64 (or a u32 in files from before MXNet 0.9).
    fn shape(&mut self, ndim: u32, ndim_at: usize, dims_64bit: bool) -> Result<Shape> {
        if ndim > MAX_DIMS {
            return Err(self.corrupt(ndim_at, format_args!("the number of dimensions is {ndim}, expected at most {MAX_DIMS}")));
        }
        let mut dims = Vec::with_capacity(ndim as usize);
        for axis in 0..ndim {
            let at = self.pos;
            let d = if dims_64bit { self.i64("a dimension")? } else { i64::from(self.u32("a dimension")?) };
            let d = usize::try_from(d).map_err(|_| self.corrupt(at, format_args!("dimension {axis} is {d}, expected a size >= 0")))?;
            dims.push(d);
        }
        let shape = Shape::new(dims);
        // The dtype comes after the shape (and not at all for empty arrays), so the extent is
        // checked for the widest dtype: no file that could exist on a disk holds more.
        let widest = DType::ALL.iter().map(|d| d.size()).max().unwrap_or(8);
        shape.checked_bytes(widest).map_err(|_| self.corrupt(ndim_at, format_args!("the dimensions {shape} multiply past the address space")))?;
        Ok(shape)
    }

    fn array(&mut self) -> Result<NDArray> {
        let header_at = self.pos;
        let magic = self.u32("an array header")?;
        let (shape, zero_d_is_scalar) = match magic {
            V2_MAGIC | V3_MAGIC => {
                let stype_at = self.pos;
                let stype = self.i32("the storage type")?;
                match stype {
                    0 => {}
                    1 | 2 => crate::bail!(Io, "sparse NDArrays ({} storage, at byte {stype_at}) are not supported yet", if stype == 1 { "row_sparse" } else { "csr" }),
                    _ => return Err(self.corrupt(stype_at, format_args!("the storage type is {stype}, expected 0 (dense), 1 (row_sparse) or 2 (csr)"))),
                }
                let ndim_at = self.pos;
                let ndim = self.u32("the number of dimensions")?;
                (self.shape(ndim, ndim_at, true)?, magic == V3_MAGIC)
            }
            V1_MAGIC => {
                let ndim_at = self.pos;
                let ndim = self.u32("the number of dimensions")?;
                (self.shape(ndim, ndim_at, true)?, false)
            }
            // Files from before MXNet 0.9 start an array with its u32 number of dimensions.
            legacy_ndim if legacy_ndim <= MAX_DIMS => (self.shape(legacy_ndim, header_at, false)?, false),
            other => {
                return Err(self.corrupt(
                    header_at,
                    format_args!("an array starts with {other:#010x}, expected the magic number {V2_MAGIC:#x} (or {V1_MAGIC:#x}, {V3_MAGIC:#x}, or at most {MAX_DIMS} dimensions in files before MXNet 0.9)"),
                ))
            }
        };
        if shape.ndim() == 0 && !zero_d_is_scalar || (shape.size() == 0 && shape.ndim() > 0) {
            // An empty (or, before NumPy semantics, undefined) array: nothing else is stored.
            return NDArray::empty(shape, DType::F32, Context::cpu(0));
        }
        let dev_at = self.pos;
        let dev_type = self.i32("the device type")?;
        let _dev_id = self.i32("the device id")?;
        crate::base::DeviceType::from_code(dev_type).map_err(|_| {
            self.corrupt(dev_at, format_args!("the device type is {dev_type}, expected 1 (cpu), 2 (gpu), 3 (cpu_pinned) or 5 (cpu_shared)"))
        })?;
        let dtype_at = self.pos;
        let flag = self.i32("the dtype")?;
        let dtype = DType::from_flag(flag).map_err(|_| {
            let known: Vec<String> = DType::ALL.iter().map(|d| format!("{} {}", d.flag(), d.name())).collect();
            self.corrupt(dtype_at, format_args!("the dtype flag is {flag}, expected one of {}", known.join(", ")))
        })?;
        let data_at = self.pos;
        let left = self.bytes.len() - data_at;
        let nbytes = shape.size().checked_mul(dtype.size()).filter(|&n| n <= left).ok_or_else(|| {
            self.corrupt(
                data_at,
                format_args!(
                    "an array of shape {shape} and dtype {} needs {} bytes, only {left} remain",
                    dtype.name(),
                    shape.size() as u128 * dtype.size() as u128
                ),
            )
        })?;
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
        return Err(r.corrupt(0, format_args!("the header is {magic:#x}, expected the magic number {LIST_MAGIC:#x}")));
    }
    r.u64("the reserved field")?;
    // The smallest array is a legacy 0-d one: its 4-byte dimension count and nothing else.
    let n = r.count("the number of arrays", 4)?;
    let mut arrays = Vec::with_capacity(n);
    for i in 0..n {
        arrays.push(r.array().map_err(|e| e.context(format!("array {i} of {n}")))?);
    }
    let names_at = r.pos;
    let k = r.u64("the number of names")?;
    if k != 0 && k != n as u64 {
        return Err(r.corrupt(names_at, format_args!("the number of names is {k}, expected 0 or {n} (one per array)")));
    }
    let k = r.bounded(k, names_at, "the number of names", 8)?;
    let mut names = Vec::with_capacity(k);
    for i in 0..k {
        let len = r.count("a name length", 1)?;
        let at = r.pos;
        let raw = r.take(len, "a name")?;
        let name = std::str::from_utf8(raw).map_err(|e| r.corrupt(at, format_args!("name {i} is not UTF-8 text ({e})")))?;
        names.push(name.to_string());
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
