//! One error type for the whole core. The Python bindings map each [`ErrorKind`] to the exception
//! MXNet raises for it, in one place.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Inconsistent or invalid shapes.
    Shape,
    /// Unsupported or mismatched dtypes.
    Type,
    /// A parameter that is unknown, missing or malformed.
    Param,
    /// An index out of range (Python: IndexError).
    Index,
    /// A value outside the domain an API accepts (Python: MXNetError, as MXNet raises).
    Value,
    /// Reading or writing files, including malformed `.params` content.
    Io,
    /// A device that is absent or a kernel missing for a device.
    Device,
    /// A failure inside a running operator (reported at the next sync point).
    Runtime,
}

#[derive(Clone, Debug)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error { kind, message: message.into() }
    }
    /// Prefix the message with where it happened (an operator name, a file).
    pub fn context(mut self, what: impl fmt::Display) -> Self {
        self.message = format!("{what}: {}", self.message);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::new(ErrorKind::Io, e.to_string())
    }
}

/// Build an [`Error`] of the given kind with `format!` arguments.
#[macro_export]
macro_rules! err {
    ($kind:ident, $($arg:tt)*) => {
        $crate::error::Error::new($crate::error::ErrorKind::$kind, format!($($arg)*))
    };
}

/// Return early with an [`Error`] of the given kind.
#[macro_export]
macro_rules! bail {
    ($kind:ident, $($arg:tt)*) => {
        return Err($crate::err!($kind, $($arg)*))
    };
}
