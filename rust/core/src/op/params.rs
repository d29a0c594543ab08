//! Typed operator parameters parsed from MXNet's string attributes.
//!
//! MXNet stores every parameter as a string (`"(2, 2)"`, `"True"`, `"relu"`), in Symbol JSON and
//! in imperative calls alike. Each operator declares its parameters once with [`op_params!`]; the
//! macro yields the typed struct, its parser (which rejects unknown names and reports the valid
//! ones) and the specs the Python layer turns into docstrings.

use std::collections::BTreeMap;

use crate::base::{Context, DType};
use crate::error::Result;

/// Attribute strings keyed by parameter name.
pub type Attrs = BTreeMap<String, String>;

/// One parameter as documentation and the Python layer see it.
#[derive(Clone, Debug)]
pub struct ParamSpec {
    pub name: &'static str,
    pub type_name: &'static str,
    /// `None` when the parameter is required.
    pub default: Option<&'static str>,
    pub doc: &'static str,
}

/// A parameter value type: how it is parsed from MXNet's textual form.
pub trait ParamValue: Sized {
    fn type_name() -> &'static str;
    fn parse_param(text: &str) -> std::result::Result<Self, String>;
}

/// A parameter set of one operator.
pub trait Params: Sized {
    fn specs() -> Vec<ParamSpec>;
    fn parse(op: &str, attrs: &Attrs) -> Result<Self>;
}

/// Operators without parameters.
#[derive(Clone, Debug, Default)]
pub struct NoParams;

impl Params for NoParams {
    fn specs() -> Vec<ParamSpec> {
        Vec::new()
    }
    fn parse(op: &str, attrs: &Attrs) -> Result<Self> {
        check_known(op, attrs, &[])?;
        Ok(NoParams)
    }
}

/// Operators that MXNet registers without a parameter parser (the element-wise binary family):
/// MXNet keeps any attribute given to them and ignores it (`broadcast_maximum(a, b, axis=1)`
/// runs), so they must accept the same calls.
#[derive(Clone, Debug, Default)]
pub struct UncheckedParams;

impl Params for UncheckedParams {
    fn specs() -> Vec<ParamSpec> {
        Vec::new()
    }
    fn parse(_op: &str, _attrs: &Attrs) -> Result<Self> {
        Ok(UncheckedParams)
    }
}

/// Attribute names every operator accepts and ignores: graph annotations such as `__lr_mult__`,
/// `__shape__`, and the Python-side `name`.
pub fn is_annotation(key: &str) -> bool {
    (key.starts_with("__") && key.ends_with("__")) || key == "name"
}

pub fn check_known(op: &str, attrs: &Attrs, known: &[&str]) -> Result<()> {
    for key in attrs.keys() {
        if !known.contains(&key.as_str()) && !is_annotation(key) {
            let valid = if known.is_empty() { "none".to_string() } else { known.join(", ") };
            crate::bail!(Param, "operator {op}: unknown parameter '{key}'; valid parameters: {valid}");
        }
    }
    Ok(())
}

pub fn parse_value<T: ParamValue>(op: &str, name: &str, text: &str) -> Result<T> {
    T::parse_param(text).map_err(|why| {
        crate::err!(Param, "operator {op}: invalid value '{text}' for parameter '{name}' ({}): {why}", T::type_name())
    })
}

pub fn missing(op: &str, name: &str, valid: &[&str]) -> crate::error::Error {
    crate::err!(Param, "operator {op}: required parameter '{name}' is missing (parameters: {})", valid.join(", "))
}

/// Declare an operator's parameter struct. Fields without `= default` are required.
#[macro_export]
macro_rules! op_params {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[doc = $doc:literal])* $field:ident : $ty:ty $(= $default:expr)? ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug)]
        pub struct $name {
            $( $(#[doc = $doc])* pub $field: $ty, )*
        }

        impl $crate::op::params::Params for $name {
            fn specs() -> Vec<$crate::op::params::ParamSpec> {
                vec![$(
                    $crate::op::params::ParamSpec {
                        name: stringify!($field),
                        type_name: <$ty as $crate::op::params::ParamValue>::type_name(),
                        default: $crate::op_params!(@default_text $($default)?),
                        doc: concat!($($doc),*),
                    }
                ),*]
            }

            fn parse(op: &str, attrs: &$crate::op::params::Attrs) -> $crate::error::Result<Self> {
                const KNOWN: &[&str] = &[$(stringify!($field)),*];
                $crate::op::params::check_known(op, attrs, KNOWN)?;
                Ok($name {
                    $( $field: match attrs.get(stringify!($field)) {
                        Some(text) => $crate::op::params::parse_value::<$ty>(op, stringify!($field), text)?,
                        None => $crate::op_params!(@default_value op, stringify!($field), KNOWN $(, $default)?),
                    }, )*
                })
            }
        }
    };
    (@default_text) => { None };
    (@default_text $d:expr) => { Some(stringify!($d)) };
    (@default_value $op:expr, $f:expr, $known:expr) => {
        return Err($crate::op::params::missing($op, $f, $known))
    };
    (@default_value $op:expr, $f:expr, $known:expr, $d:expr) => { $d };
}

impl ParamValue for bool {
    fn type_name() -> &'static str {
        "boolean"
    }
    fn parse_param(text: &str) -> std::result::Result<Self, String> {
        match text.trim() {
            "True" | "true" | "1" => Ok(true),
            "False" | "false" | "0" => Ok(false),
            _ => Err("expected True or False".into()),
        }
    }
}

fn parse_int(text: &str) -> std::result::Result<i64, String> {
    let t = text.trim().trim_end_matches('L');
    // MXNet writes some integers as floats ("2.0", "1e3"); they are accepted when exact. Beyond
    // 2^53 a float no longer names one integer, and a cast would saturate ("1e30" would become
    // i64::MAX), so such values are refused.
    const EXACT_FLOAT_INTEGERS: f64 = (1u64 << 53) as f64;
    t.parse::<i64>().or_else(|_| match t.parse::<f64>() {
        Ok(f) if f.fract() == 0.0 && f.abs() <= EXACT_FLOAT_INTEGERS => Ok(f as i64),
        Ok(f) if f.is_finite() && f.fract() == 0.0 => Err(format!("{t} is out of the range of integer parameters")),
        _ => Err("expected an integer".into()),
    })
}

impl ParamValue for i64 {
    fn type_name() -> &'static str {
        "int"
    }
    fn parse_param(text: &str) -> std::result::Result<Self, String> {
        parse_int(text)
    }
}

impl ParamValue for usize {
    fn type_name() -> &'static str {
        "int (non-negative)"
    }
    fn parse_param(text: &str) -> std::result::Result<Self, String> {
        let v = parse_int(text)?;
        usize::try_from(v).map_err(|_| "expected a non-negative integer".into())
    }
}

impl ParamValue for f64 {
    fn type_name() -> &'static str {
        "double"
    }
    fn parse_param(text: &str) -> std::result::Result<Self, String> {
        match text.trim() {
            "inf" | "Inf" | "infinity" => Ok(f64::INFINITY),
            "-inf" | "-Inf" | "-infinity" => Ok(f64::NEG_INFINITY),
            "nan" | "NaN" => Ok(f64::NAN),
            "True" => Ok(1.0),
            "False" => Ok(0.0),
            t => t.parse::<f64>().map_err(|_| "expected a number".into()),
        }
    }
}

impl ParamValue for String {
    fn type_name() -> &'static str {
        "string"
    }
    fn parse_param(text: &str) -> std::result::Result<Self, String> {
        Ok(text.trim().trim_matches('\'').trim_matches('"').to_string())
    }
}

impl ParamValue for DType {
    fn type_name() -> &'static str {
        "dtype ('float32', 'float64', 'float16', 'bfloat16', 'uint8', 'int8', 'int32', 'int64', 'bool')"
    }
    fn parse_param(text: &str) -> std::result::Result<Self, String> {
        let t = text.trim().trim_matches('\'').trim_matches('"');
        let t = t.strip_prefix("<class 'numpy.").map(|r| r.trim_end_matches("'>")).unwrap_or(t);
        DType::from_name(t).map_err(|e| e.message)
    }
}

impl ParamValue for Context {
    fn type_name() -> &'static str {
        "context ('cpu(0)', 'gpu(0)', ...)"
    }
    fn parse_param(text: &str) -> std::result::Result<Self, String> {
        Context::parse(text).map_err(|e| e.message)
    }
}

impl<T: ParamValue> ParamValue for Option<T> {
    fn type_name() -> &'static str {
        T::type_name()
    }
    fn parse_param(text: &str) -> std::result::Result<Self, String> {
        match text.trim() {
            "None" | "" => Ok(None),
            t => T::parse_param(t).map(Some),
        }
    }
}

/// A tuple such as `(2, 3)`, `[2,3]`, `(2,)` or a bare `2`.
fn tuple_items(text: &str) -> Vec<&str> {
    let t = text.trim();
    let inner = t
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .or_else(|| t.strip_prefix('[').and_then(|r| r.strip_suffix(']')))
        .unwrap_or(t);
    inner.split(',').map(str::trim).filter(|s| !s.is_empty()).collect()
}

impl ParamValue for Vec<i64> {
    fn type_name() -> &'static str {
        "tuple of int"
    }
    fn parse_param(text: &str) -> std::result::Result<Self, String> {
        tuple_items(text).into_iter().map(parse_int).collect()
    }
}

impl ParamValue for Vec<f64> {
    fn type_name() -> &'static str {
        "tuple of float"
    }
    fn parse_param(text: &str) -> std::result::Result<Self, String> {
        tuple_items(text).into_iter().map(f64::parse_param).collect()
    }
}

impl ParamValue for Vec<Option<i64>> {
    fn type_name() -> &'static str {
        "tuple of int or None"
    }
    fn parse_param(text: &str) -> std::result::Result<Self, String> {
        tuple_items(text)
            .into_iter()
            .map(|s| if s == "None" { Ok(None) } else { parse_int(s).map(Some) })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::op_params! {
        pub struct Demo {
            /// The axes.
            axis: Option<Vec<i64>> = None,
            keepdims: bool = false,
            num_outputs: usize,
        }
    }

    fn attrs(kv: &[(&str, &str)]) -> Attrs {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn parses_mxnet_strings() {
        let p = Demo::parse("demo", &attrs(&[("axis", "(0, -1)"), ("keepdims", "True"), ("num_outputs", "3")])).unwrap();
        assert_eq!(p.axis, Some(vec![0, -1]));
        assert!(p.keepdims);
        assert_eq!(p.num_outputs, 3);
        let p = Demo::parse("demo", &attrs(&[("axis", "1"), ("num_outputs", "2"), ("__lr_mult__", "2")])).unwrap();
        assert_eq!(p.axis, Some(vec![1]));
        assert_eq!(Demo::specs()[0].doc, " The axes.");
    }

    #[test]
    fn rejects_unknown_missing_and_malformed() {
        let e = Demo::parse("demo", &attrs(&[("num_outputs", "2"), ("axes", "1")])).unwrap_err();
        assert!(e.message.contains("unknown parameter 'axes'") && e.message.contains("axis, keepdims, num_outputs"));
        let e = Demo::parse("demo", &attrs(&[])).unwrap_err();
        assert!(e.message.contains("required parameter 'num_outputs'"));
        let e = Demo::parse("demo", &attrs(&[("num_outputs", "x")])).unwrap_err();
        assert!(e.message.contains("invalid value 'x'"));
    }
}
