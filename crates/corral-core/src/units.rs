//! Parsing of human-written sizes ("64m", "1.5g") and CPU counts ("1.5").

use std::fmt;

/// A value could not be parsed; names what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{value}' is not {expected}")]
pub struct ParseError {
    /// The rejected text.
    pub value: String,
    /// What a valid value looks like.
    pub expected: &'static str,
}

const SIZE_EXPECTED: &str =
    "a size: a number with an optional unit b, k, m, g or t (powers of 1024), e.g. 64m or 1.5g";

/// Parses a byte size: `1024`, `64k`, `64m`, `1.5g`, `2GiB`, `512MB` (all units
/// are powers of 1024, as Docker reads them).
pub fn parse_bytes(text: &str) -> Result<u64, ParseError> {
    let err = || ParseError {
        value: text.to_string(),
        expected: SIZE_EXPECTED,
    };
    let t = text.trim().to_ascii_lowercase();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(err()),
    };
    if num.is_empty() {
        return Err(err());
    }
    let value: f64 = num.parse().map_err(|_| err())?;
    let bytes = value * mult as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(err());
    }
    Ok(bytes.round() as u64)
}

/// Parses a CPU count such as `1`, `0.5` or `1.5` into nano-CPUs.
pub fn parse_cpus(text: &str) -> Result<f64, ParseError> {
    let err = || ParseError {
        value: text.to_string(),
        expected: "a positive number of CPUs, e.g. 0.5 or 2",
    };
    let v: f64 = text.trim().parse().map_err(|_| err())?;
    if !v.is_finite() || v <= 0.0 || v > 4096.0 {
        return Err(err());
    }
    Ok(v)
}

/// Shows a byte count the way [`parse_bytes`] reads it, e.g. `64m`.
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let units = [
            (1u64 << 40, "t"),
            (1 << 30, "g"),
            (1 << 20, "m"),
            (1 << 10, "k"),
        ];
        for (size, unit) in units {
            if self.0 >= size && self.0.is_multiple_of(size) {
                return write!(f, "{}{}", self.0 / size, unit);
            }
        }
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_bytes("1024"), Ok(1024));
        assert_eq!(parse_bytes("64m"), Ok(64 << 20));
        assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes("1.5g"), Ok(3 << 29));
        assert_eq!(parse_bytes(" 2k "), Ok(2048));
        for bad in ["lots", "", "m", "-1m", "1x", "1.2.3m", "nan"] {
            let e = parse_bytes(bad).expect_err(bad);
            assert_eq!(e.value, bad);
        }
    }

    #[test]
    fn parses_cpus() {
        assert_eq!(parse_cpus("1.5"), Ok(1.5));
        assert!(parse_cpus("0").is_err());
        assert!(parse_cpus("-1").is_err());
        assert!(parse_cpus("many").is_err());
        assert!(parse_cpus("inf").is_err());
    }

    #[test]
    fn displays_sizes() {
        assert_eq!(Bytes(64 << 20).to_string(), "64m");
        assert_eq!(Bytes(1000).to_string(), "1000");
        assert_eq!(Bytes(3 << 29).to_string(), "1536m");
    }
}
