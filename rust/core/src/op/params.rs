//! Typed operator parameters parsed from MXNet's string attributes.
//!
//! MXNet stores every parameter as a string (`"(2, 2)"`, `"True"`, `"relu"`), in Symbol JSON and
//! in imperative calls alike. Each operator declares its parameters once with [`op_params!`](crate::op_params); the
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
    /// The default in MXNet's textual form; `None` when the parameter is required.
    pub default: Option<String>,
    pub doc: &'static str,
}

/// A parameter value type: how it is parsed from MXNet's textual form.
pub trait ParamValue: Sized {
    fn type_name() -> &'static str;
    fn parse_param(text: &str) -> std::result::Result<Self, String>;
    /// The value in MXNet's textual form, which [`ParamValue::parse_param`] reads back.
    fn to_param(&self) -> String;
}

/// A parameter set of one operator.
pub trait Params: Sized {
    fn specs() -> Vec<ParamSpec>;
    fn parse(op: &str, attrs: &Attrs) -> Result<Self>;
    /// The parameters as MXNet's string attributes, those at their default left out (as MXNet
    /// writes a node's attributes): what typed calls from Rust hand to the registry and what a
    /// recorded graph saves.
    fn to_attrs(&self) -> Attrs;
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
    fn to_attrs(&self) -> Attrs {
        Attrs::new()
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
    fn to_attrs(&self) -> Attrs {
        Attrs::new()
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
    T::parse_param(text).map_err(|why| crate::err!(Param, "operator {op}: invalid value '{text}' for parameter '{name}' ({}): {why}", T::type_name()))
}

pub fn missing(op: &str, name: &str, valid: &[&str]) -> crate::error::Error {
    crate::err!(Param, "operator {op}: required parameter '{name}' is missing (parameters: {})", valid.join(", "))
}

/// Declare a parameter that takes one of a fixed set of names (MXNet's enum parameters, such as
/// `act_type` or `pool_type`): an enum whose variants parse from those names (quoted or not),
/// print as them, and show as `{'a', 'b'}` in docs and errors, as MXNet lists them.
///
/// ```
/// oxnet::param_choice! {
///     /// How far to go.
///     pub enum Reach { Near = "near", Far = "far" }
/// }
/// use oxnet::op::params::ParamValue;
/// assert_eq!(Reach::parse_param("'far'"), Ok(Reach::Far));
/// assert_eq!(Reach::Near.to_param(), "near");
/// assert_eq!(Reach::type_name(), "{'near', 'far'}");
/// assert!(Reach::parse_param("away").is_err());
/// ```
#[macro_export]
macro_rules! param_choice {
    (
        $(#[$meta:meta])*
        pub enum $name:ident { $( $(#[doc = $doc:literal])* $variant:ident = $text:literal ),+ $(,)? }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[doc = $doc])* $variant, )+
        }

        impl $name {
            /// The value's name in MXNet.
            pub fn name(self) -> &'static str {
                match self {
                    $( $name::$variant => $text, )+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl $crate::op::params::ParamValue for $name {
            fn type_name() -> &'static str {
                static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
                NAME.get_or_init(|| $crate::op::params::choice_list(&[$($text),+]))
            }
            fn parse_param(text: &str) -> std::result::Result<Self, String> {
                match text.trim().trim_matches('\'').trim_matches('"') {
                    $( $text => Ok($name::$variant), )+
                    _ => Err("not one of the valid values".to_string()),
                }
            }
            fn to_param(&self) -> String {
                self.name().to_string()
            }
        }
    };
}

/// MXNet's form of a choice parameter's values: `{'relu', 'sigmoid'}`.
pub fn choice_list(names: &[&str]) -> String {
    format!("{{{}}}", names.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", "))
}

/// Declare an operator's parameter struct. Fields without `= default` are required.
///
/// Besides the struct, its parser and its specs, the macro gives Rust callers the typed side:
/// `new` taking the required fields in order (every other field at its default; a struct
/// without required fields also implements `Default`), one setter per field named as the field
/// (`FullyConnectedParams::new(10).no_bias(true)`), and [`Params::to_attrs`].
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
                        default: $crate::op_params!(@default_text $ty $(, $default)?),
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

            fn to_attrs(&self) -> $crate::op::params::Attrs {
                let mut attrs = $crate::op::params::Attrs::new();
                $( $crate::op_params!(@emit attrs, self, $field, $ty $(, $default)?); )*
                attrs
            }
        }

        $crate::op_params!(@new $name [] [] $( $field : $ty $(= $default)? ; )*);

        // MXNet spells a few parameters in capitals (`eye`'s `N` and `M`); setters keep its names.
        #[allow(non_snake_case)]
        impl $name {
            $(
                #[doc = concat!("Sets `", stringify!($field), "`:", $($doc),*)]
                pub fn $field(mut self, value: $ty) -> Self {
                    self.$field = value;
                    self
                }
            )*
        }
    };
    (@default_text $ty:ty) => { None };
    (@default_text $ty:ty, $d:expr) => {{
        let default: $ty = $d;
        Some($crate::op::params::ParamValue::to_param(&default))
    }};
    (@default_value $op:expr, $f:expr, $known:expr) => {
        return Err($crate::op::params::missing($op, $f, $known))
    };
    (@default_value $op:expr, $f:expr, $known:expr, $d:expr) => { $d };
    (@emit $attrs:ident, $self:ident, $field:ident, $ty:ty) => {
        $attrs.insert(stringify!($field).to_string(), $crate::op::params::ParamValue::to_param(&$self.$field));
    };
    (@emit $attrs:ident, $self:ident, $field:ident, $ty:ty, $d:expr) => {
        let text = $crate::op::params::ParamValue::to_param(&$self.$field);
        let default: $ty = $d;
        if text != $crate::op::params::ParamValue::to_param(&default) {
            $attrs.insert(stringify!($field).to_string(), text);
        }
    };
    // `new` from the fields sorted into required and defaulted ones, one field at a time.
    (@new $name:ident [$($req:ident : $rty:ty,)*] [$($opt:ident = $od:expr,)*] $field:ident : $ty:ty = $d:expr ; $($rest:tt)*) => {
        $crate::op_params!(@new $name [$($req : $rty,)*] [$($opt = $od,)* $field = $d,] $($rest)*);
    };
    (@new $name:ident [$($req:ident : $rty:ty,)*] [$($opt:ident = $od:expr,)*] $field:ident : $ty:ty ; $($rest:tt)*) => {
        $crate::op_params!(@new $name [$($req : $rty,)* $field : $ty,] [$($opt = $od,)*] $($rest)*);
    };
    (@new $name:ident [] [$($opt:ident = $od:expr,)*]) => {
        impl $name {
            /// Every parameter at its MXNet default.
            pub fn new() -> Self {
                $name { $($opt: $od,)* }
            }
        }
        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }
    };
    (@new $name:ident [$($req:ident : $rty:ty,)+] [$($opt:ident = $od:expr,)*]) => {
        #[allow(non_snake_case)]
        impl $name {
            /// The required parameters, in declaration order; every other at its MXNet default.
            pub fn new($($req: $rty),+) -> Self {
                $name { $($req,)+ $($opt: $od,)* }
            }
        }
    };
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
    fn to_param(&self) -> String {
        if *self { "True" } else { "False" }.to_string()
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
    fn to_param(&self) -> String {
        self.to_string()
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
    fn to_param(&self) -> String {
        self.to_string()
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
    fn to_param(&self) -> String {
        // Debug is the shortest text that reads back as the same value ("1e-7", "inf", "NaN").
        format!("{self:?}")
    }
}

impl ParamValue for String {
    fn type_name() -> &'static str {
        "string"
    }
    fn parse_param(text: &str) -> std::result::Result<Self, String> {
        Ok(text.trim().trim_matches('\'').trim_matches('"').to_string())
    }
    fn to_param(&self) -> String {
        self.clone()
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
    fn to_param(&self) -> String {
        self.name().to_string()
    }
}

impl ParamValue for Context {
    fn type_name() -> &'static str {
        "context ('cpu(0)', 'gpu(0)', ...)"
    }
    fn parse_param(text: &str) -> std::result::Result<Self, String> {
        Context::parse(text).map_err(|e| e.message)
    }
    fn to_param(&self) -> String {
        self.to_string()
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
    fn to_param(&self) -> String {
        self.as_ref().map_or_else(|| "None".to_string(), T::to_param)
    }
}

/// A tuple such as `(2, 3)`, `[2,3]`, `(2,)` or a bare `2`.
fn tuple_items(text: &str) -> Vec<&str> {
    let t = text.trim();
    let inner = t.strip_prefix('(').and_then(|r| r.strip_suffix(')')).or_else(|| t.strip_prefix('[').and_then(|r| r.strip_suffix(']'))).unwrap_or(t);
    inner.split(',').map(str::trim).filter(|s| !s.is_empty()).collect()
}

/// Items as Python writes a tuple: `(2, 3)`, `(2,)`, `()`.
fn tuple_text(items: impl Iterator<Item = String>) -> String {
    let items: Vec<String> = items.collect();
    match items.as_slice() {
        [only] => format!("({only},)"),
        _ => format!("({})", items.join(", ")),
    }
}

impl ParamValue for Vec<i64> {
    fn type_name() -> &'static str {
        "tuple of int"
    }
    fn parse_param(text: &str) -> std::result::Result<Self, String> {
        tuple_items(text).into_iter().map(parse_int).collect()
    }
    fn to_param(&self) -> String {
        tuple_text(self.iter().map(i64::to_param))
    }
}

impl ParamValue for Vec<f64> {
    fn type_name() -> &'static str {
        "tuple of float"
    }
    fn parse_param(text: &str) -> std::result::Result<Self, String> {
        tuple_items(text).into_iter().map(f64::parse_param).collect()
    }
    fn to_param(&self) -> String {
        tuple_text(self.iter().map(f64::to_param))
    }
}

impl ParamValue for Vec<Option<i64>> {
    fn type_name() -> &'static str {
        "tuple of int or None"
    }
    fn parse_param(text: &str) -> std::result::Result<Self, String> {
        tuple_items(text).into_iter().map(|s| if s == "None" { Ok(None) } else { parse_int(s).map(Some) }).collect()
    }
    fn to_param(&self) -> String {
        tuple_text(self.iter().map(Option::<i64>::to_param))
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

    #[test]
    fn typed_parameters_write_what_the_parser_reads() {
        let p = Demo::new(3);
        assert_eq!(p.to_attrs(), attrs(&[("num_outputs", "3")]), "defaults are left out, required fields kept");
        let p = p.axis(Some(vec![0, -1])).keepdims(true).num_outputs(4);
        let text = p.to_attrs();
        assert_eq!(text, attrs(&[("axis", "(0, -1)"), ("keepdims", "True"), ("num_outputs", "4")]));
        let back = Demo::parse("demo", &text).unwrap();
        assert_eq!((back.axis, back.keepdims, back.num_outputs), (Some(vec![0, -1]), true, 4));
        assert_eq!(Demo::new(1).axis(Some(vec![2])).to_attrs()["axis"], "(2,)");
        for v in [0.5, 1e-7, 3e300, f64::INFINITY, -2.0] {
            assert_eq!(f64::parse_param(&v.to_param()).unwrap(), v);
        }
        assert!(f64::parse_param(&f64::NAN.to_param()).unwrap().is_nan());
        assert_eq!(Vec::<Option<i64>>::parse_param(&vec![None, Some(-1)].to_param()).unwrap(), vec![None, Some(-1)]);
        assert_eq!(Option::<Context>::parse_param(&Some(Context::cpu(0)).to_param()).unwrap(), Some(Context::cpu(0)));
        assert_eq!(DType::parse_param(&DType::BF16.to_param()).unwrap(), DType::BF16);
    }
}
