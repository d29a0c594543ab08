//! Element types with MXNet's type flags (the integers stored in `.params` files and Symbol JSON).

use crate::error::Result;
use half::{bf16, f16};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F64,
    F16,
    U8,
    I32,
    I8,
    I64,
    Bool,
    BF16,
}

impl DType {
    pub const ALL: [DType; 9] = [DType::F32, DType::F64, DType::F16, DType::U8, DType::I32, DType::I8, DType::I64, DType::Bool, DType::BF16];

    /// MXNet's `mshadow::TypeFlag` value.
    pub fn flag(self) -> i32 {
        match self {
            DType::F32 => 0,
            DType::F64 => 1,
            DType::F16 => 2,
            DType::U8 => 3,
            DType::I32 => 4,
            DType::I8 => 5,
            DType::I64 => 6,
            DType::Bool => 7,
            DType::BF16 => 12,
        }
    }

    pub fn from_flag(flag: i32) -> Result<DType> {
        DType::ALL.into_iter().find(|d| d.flag() == flag).ok_or_else(|| crate::err!(Type, "unknown MXNet dtype flag {flag}"))
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::F16 => "float16",
            DType::U8 => "uint8",
            DType::I32 => "int32",
            DType::I8 => "int8",
            DType::I64 => "int64",
            DType::Bool => "bool",
            DType::BF16 => "bfloat16",
        }
    }

    pub fn from_name(name: &str) -> Result<DType> {
        let canonical = match name {
            "float" | "float_" => "float64",
            "double" => "float64",
            "half" => "float16",
            "int" => "int64",
            "bool_" => "bool",
            other => other,
        };
        DType::ALL.into_iter().find(|d| d.name() == canonical).ok_or_else(|| {
            crate::err!(Type, "unknown dtype '{name}'; expected one of float32, float64, float16, bfloat16, uint8, int8, int32, int64, bool")
        })
    }

    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::U8 | DType::I8 | DType::Bool => 1,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A storable element. Sums and products over many elements accumulate in [`Elem::Acc`]: float32
/// for the 16-bit floats (so that float16/bfloat16 kernels keep float32 precision, and convert by
/// cheap bit operations where `to_f64`/`from_f64` round through float64 one element at a time),
/// i64 for the integers and booleans (exact), the type itself for float32 and float64.
pub trait Elem: Copy + Send + Sync + PartialOrd + Default + 'static {
    const DTYPE: DType;
    /// Where sums of this element type accumulate.
    type Acc: Elem + std::ops::Add<Output = Self::Acc>;
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
    fn to_i64(self) -> i64;
    fn from_i64(v: i64) -> Self;
    /// The value in the accumulator type (exact).
    fn widen(self) -> Self::Acc;
    /// An accumulated value back in this type: rounded to nearest even for the 16-bit floats,
    /// wrapped as `as` does for the integers, nonzero-is-true for booleans.
    fn narrow(acc: Self::Acc) -> Self;
}

/// `values` seen as their accumulator type where that is the element type itself (float32,
/// float64, int64), so that a kernel can sum straight into them; `None` where sums need a
/// buffer of their own.
pub fn as_acc_mut<T: Elem>(values: &mut [T]) -> Option<&mut [T::Acc]> {
    if T::DTYPE != <T::Acc as Elem>::DTYPE {
        return None;
    }
    // SAFETY: every dtype has exactly one `Elem` type (the impls below, one per DType), so equal
    // dtypes mean that T::Acc is T: same size, alignment and bit validity.
    Some(unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr().cast::<T::Acc>(), values.len()) })
}

/// Native numeric types convert with `as` (saturating for float-to-int, as NumPy's casts do on x86).
macro_rules! impl_native_elem {
    ($t:ty, $dt:expr, $acc:ty) => {
        impl Elem for $t {
            const DTYPE: DType = $dt;
            type Acc = $acc;
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn to_i64(self) -> i64 {
                self as i64
            }
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn widen(self) -> $acc {
                self as $acc
            }
            #[inline(always)]
            fn narrow(acc: $acc) -> Self {
                acc as $t
            }
        }
    };
}
impl_native_elem!(f32, DType::F32, f32);
impl_native_elem!(f64, DType::F64, f64);
impl_native_elem!(u8, DType::U8, i64);
impl_native_elem!(i8, DType::I8, i64);
impl_native_elem!(i32, DType::I32, i64);
impl_native_elem!(i64, DType::I64, i64);

macro_rules! impl_half_elem {
    ($t:ty, $dt:expr, $widen:path, $narrow:path) => {
        impl Elem for $t {
            const DTYPE: DType = $dt;
            type Acc = f32;
            /// Through float32, which holds every 16-bit float exactly: a shift (bfloat16) the
            /// compiler vectorizes, where `half`'s direct conversion rebiases the exponent in
            /// scalar code (a bfloat16 bias gradient's sums spent a third of a backward pass so).
            #[inline(always)]
            fn to_f64(self) -> f64 {
                $widen(self) as f64
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                <$t>::from_f64(v)
            }
            #[inline(always)]
            fn to_i64(self) -> i64 {
                self.to_f32() as i64
            }
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                <$t>::from_f32(v as f32)
            }
            #[inline(always)]
            fn widen(self) -> f32 {
                $widen(self)
            }
            #[inline(always)]
            fn narrow(acc: f32) -> Self {
                $narrow(acc)
            }
        }
    };
}
impl_half_elem!(f16, DType::F16, f16::to_f32, f16::from_f32);
impl_half_elem!(bf16, DType::BF16, bf16_to_f32, bf16_from_f32);

/// bfloat16 as float32: its bits are float32's upper half. A NaN stays a NaN (signalling ones
/// are not quieted, as `half` does, which arithmetic does anyway); written as a plain shift so
/// that loops over short lines vectorize, where `half`'s select kept col2im scalar.
#[inline(always)]
fn bf16_to_f32(v: bf16) -> f32 {
    f32::from_bits((v.to_bits() as u32) << 16)
}

/// float32 rounded to the nearest bfloat16, ties to even, NaN quieted: the values `half` gives,
/// written as selects rather than branches so that it vectorizes.
#[inline(always)]
fn bf16_from_f32(v: f32) -> bf16 {
    let bits = v.to_bits();
    let is_nan = bits & 0x7FFF_FFFF > 0x7F80_0000;
    // Adding 0x7FFF plus the kept part's lowest bit carries into the kept part exactly when the
    // dropped half is above one half, or is one half and the kept part is odd.
    let rounded = bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) >> 16;
    let quiet = (bits >> 16) | 0x0040;
    bf16::from_bits(if is_nan { quiet } else { rounded } as u16)
}

/// Booleans are stored as one byte holding 0 or 1, as in MXNet and NumPy.
#[derive(Clone, Copy, Debug, Default, PartialEq, PartialOrd)]
#[repr(transparent)]
pub struct Bool8(pub u8);

impl Elem for Bool8 {
    const DTYPE: DType = DType::Bool;
    type Acc = i64;
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self.0 as f64
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        Bool8((v != 0.0) as u8)
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self.0 as i64
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        Bool8((v != 0) as u8)
    }
    #[inline(always)]
    fn widen(self) -> i64 {
        self.0 as i64
    }
    #[inline(always)]
    fn narrow(acc: i64) -> Self {
        Bool8((acc != 0) as u8)
    }
}

/// Run `$body` with `$T` bound to the Rust element type of `$dtype`: every dtype, or only those
/// listed, with `$other` bound to any other dtype in `$fallback`.
///
/// ```ignore
/// dispatch_dtype!(dtype, T => kernel::<T>(data));
/// dispatch_dtype!(dtype, [F32, F64], T => kernel::<T>(data), other => bail!(Type, "no {other}"));
/// ```
#[macro_export]
macro_rules! dispatch_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {
        $crate::dispatch_dtype!($dtype, [F32, F64, F16, BF16, U8, I8, I32, I64, Bool], $T => $body)
    };
    ($dtype:expr, [$($variant:ident),+], $T:ident => $body:expr) => {{
        match $dtype {
            $($crate::base::DType::$variant => {
                type $T = $crate::dispatch_dtype!(@element $variant);
                $body
            })+
        }
    }};
    ($dtype:expr, [$($variant:ident),+], $T:ident => $body:expr, $other:ident => $fallback:expr) => {{
        match $dtype {
            $($crate::base::DType::$variant => {
                type $T = $crate::dispatch_dtype!(@element $variant);
                $body
            })+
            #[allow(unreachable_patterns)]
            $other => $fallback,
        }
    }};
    (@element F32) => { f32 };
    (@element F64) => { f64 };
    (@element F16) => { half::f16 };
    (@element BF16) => { half::bf16 };
    (@element U8) => { u8 };
    (@element I8) => { i8 };
    (@element I32) => { i32 };
    (@element I64) => { i64 };
    (@element Bool) => { $crate::base::dtype_bool::Bool8 };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bfloat16_conversions_match_half() {
        // Every bfloat16 widens to the value `half` gives (NaNs to a NaN).
        for bits in 0..=u16::MAX {
            let v = bf16::from_bits(bits);
            let (ours, theirs) = (bf16_to_f32(v), v.to_f32());
            assert!(ours == theirs || (ours.is_nan() && theirs.is_nan()), "{bits:#x}");
        }
        // Rounding: every float32 near each bfloat16 step, ties, carries into the exponent,
        // infinities, NaNs and signed zeros, bit for bit against `half`.
        let mut probes = vec![0.0f32, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -f32::NAN, f32::MAX, f32::MIN_POSITIVE];
        for high in (0..=u16::MAX).step_by(7) {
            for low in [0u32, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF] {
                probes.push(f32::from_bits(((high as u32) << 16) | low));
            }
        }
        for v in probes {
            assert_eq!(bf16_from_f32(v).to_bits(), bf16::from_f32(v).to_bits(), "{:#x}", v.to_bits());
        }
    }

    #[test]
    fn sums_accumulate_in_float32_for_the_16_bit_floats_and_round_once() {
        use half::bf16;
        // 1 + 3 x 2^-9: bfloat16 sums rounding each step stay at 1 (each 2^-9 is under half of
        // 1's step, 2^-7), a float32 sum rounded once is the next bfloat16 above 1.
        let small = bf16::from_f32(2f32.powi(-9));
        let mut stepwise = bf16::ONE;
        let mut sum = bf16::ONE.widen();
        for _ in 0..3 {
            stepwise = bf16::narrow(stepwise.widen() + small.widen());
            sum += small.widen();
        }
        assert_eq!(stepwise, bf16::ONE);
        assert_eq!(bf16::narrow(sum), bf16::from_f32(1.0 + 2f32.powi(-7)));
        assert_eq!(bf16::from_f32(-3.5).to_f64(), -3.5);
        assert!(bf16::NAN.to_f64().is_nan());
        assert_eq!(Bool8::narrow(Bool8(1).widen() + Bool8(1).widen()), Bool8(1));
        assert_eq!(i8::narrow(i8::MAX.widen() + 1i8.widen()), i8::MIN);
        let (mut floats, mut halves) = ([1f32, 2.0], [bf16::ONE; 2]);
        assert_eq!(as_acc_mut(&mut floats).map(|s| s.len()), Some(2));
        assert!(as_acc_mut(&mut halves).is_none());
    }

    #[test]
    fn flags_round_trip_and_match_mxnet() {
        for d in DType::ALL {
            assert_eq!(DType::from_flag(d.flag()).unwrap(), d);
            assert_eq!(DType::from_name(d.name()).unwrap(), d);
        }
        assert_eq!(DType::BF16.flag(), 12);
        assert_eq!(DType::I64.flag(), 6);
        assert!(DType::from_flag(9).is_err());
        assert!(DType::from_name("complex64").is_err());
    }
}
