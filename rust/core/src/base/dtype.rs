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

/// A storable element. Floating types compute in `Acc` (f32 for the 16-bit floats, so that
/// float16/bfloat16 kernels keep float32 precision inside one expression); integer types compute
/// through i64 so that integer arithmetic stays exact.
pub trait Elem: Copy + Send + Sync + PartialOrd + Default + 'static {
    const DTYPE: DType;
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
    fn to_i64(self) -> i64;
    fn from_i64(v: i64) -> Self;
}

/// Native numeric types convert with `as` (saturating for float-to-int, as NumPy's casts do on x86).
macro_rules! impl_native_elem {
    ($t:ty, $dt:expr) => {
        impl Elem for $t {
            const DTYPE: DType = $dt;
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
        }
    };
}
impl_native_elem!(f32, DType::F32);
impl_native_elem!(f64, DType::F64);
impl_native_elem!(u8, DType::U8);
impl_native_elem!(i8, DType::I8);
impl_native_elem!(i32, DType::I32);
impl_native_elem!(i64, DType::I64);

macro_rules! impl_half_elem {
    ($t:ty, $dt:expr) => {
        impl Elem for $t {
            const DTYPE: DType = $dt;
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self.to_f64()
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
        }
    };
}
impl_half_elem!(f16, DType::F16);
impl_half_elem!(bf16, DType::BF16);

/// Booleans are stored as one byte holding 0 or 1, as in MXNet and NumPy.
#[derive(Clone, Copy, Debug, Default, PartialEq, PartialOrd)]
#[repr(transparent)]
pub struct Bool8(pub u8);

impl Elem for Bool8 {
    const DTYPE: DType = DType::Bool;
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
