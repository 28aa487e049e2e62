//! Resource quantities (`500m`, `1Gi`, `2e3`) with exact arithmetic.
//!
//! A quantity is held as an integer count of nano-units (10^-9), which covers every value the
//! Kubernetes API can express at its own precision: finer fractions round up (away from zero),
//! as `resource.Quantity` does. Formatting follows Kubernetes' canonical form, so `1.5Gi`
//! prints as `1536Mi` and `0.5` as `500m`.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::{Add, Neg, Sub};
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

const NANO: i128 = 1_000_000_000;
/// Quantities beyond ±10^36 nano-units (10^27 units, over 800 Ei) are refused as out of range.
const LIMIT: i128 = 1_000_000_000_000_000_000_000_000_000_000_000_000;

/// How a quantity was written, which decides how it is printed back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// `Ki`, `Mi`, ... powers of 1024.
    BinarySI,
    /// `m`, `k`, `M`, ... powers of 1000 (and no suffix).
    DecimalSI,
    /// `e3`, `E-6`: an explicit power of ten.
    DecimalExponent,
}

/// An exact resource amount with its preferred format.
#[derive(Clone, Copy, Debug)]
pub struct Quantity {
    nanos: i128,
    format: Format,
}

/// Why a string is not a quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error(
        "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )]
    Format,
    #[error("unable to parse quantity's suffix")]
    Suffix,
    #[error("quantity is out of range")]
    Range,
}

impl Quantity {
    pub const ZERO: Quantity = Quantity {
        nanos: 0,
        format: Format::DecimalSI,
    };

    /// `value` whole units, e.g. `Quantity::from_int(4, Format::DecimalSI)` is `4`.
    pub fn from_int(value: i64, format: Format) -> Self {
        Quantity {
            nanos: value as i128 * NANO,
            format,
        }
    }

    /// `milli` thousandths of a unit, e.g. 500 is `500m`.
    pub fn from_milli(milli: i64) -> Self {
        Quantity {
            nanos: milli as i128 * 1_000_000,
            format: Format::DecimalSI,
        }
    }

    /// A quantity of `nanos` nano-units.
    pub fn from_nanos(nanos: i128, format: Format) -> Result<Self, QuantityError> {
        if nanos.abs() > LIMIT {
            return Err(QuantityError::Range);
        }
        Ok(Quantity { nanos, format })
    }

    pub fn nanos(&self) -> i128 {
        self.nanos
    }

    pub fn format(&self) -> Format {
        self.format
    }

    pub fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    pub fn is_negative(&self) -> bool {
        self.nanos < 0
    }

    /// The value in thousandths, rounded up (CPU cores to millicores).
    pub fn milli_value(&self) -> i128 {
        ceil_div(self.nanos, 1_000_000)
    }

    /// The value in whole units, rounded up (bytes, pods, GPUs).
    pub fn value(&self) -> i128 {
        ceil_div(self.nanos, NANO)
    }

    /// An approximation for ratios (water levels); never used for bookkeeping.
    pub fn as_f64(&self) -> f64 {
        self.nanos as f64 / NANO as f64
    }

    pub fn checked_add(&self, other: &Quantity) -> Option<Quantity> {
        let nanos = self.nanos.checked_add(other.nanos)?;
        (nanos.abs() <= LIMIT).then_some(Quantity {
            nanos,
            format: self.pick_format(other),
        })
    }

    pub fn checked_sub(&self, other: &Quantity) -> Option<Quantity> {
        let nanos = self.nanos.checked_sub(other.nanos)?;
        (nanos.abs() <= LIMIT).then_some(Quantity {
            nanos,
            format: self.pick_format(other),
        })
    }

    /// The quantity times an integer (a per-replica request times replicas).
    pub fn checked_mul(&self, factor: i64) -> Option<Quantity> {
        let nanos = self.nanos.checked_mul(factor as i128)?;
        (nanos.abs() <= LIMIT).then_some(Quantity {
            nanos,
            format: self.format,
        })
    }

    /// How many whole times `per` fits into this quantity (free capacity into replicas).
    pub fn fits(&self, per: &Quantity) -> Option<i128> {
        if per.nanos <= 0 {
            return None;
        }
        Some((self.nanos.max(0)) / per.nanos)
    }

    // Kubernetes keeps the receiver's format unless the receiver is zero.
    fn pick_format(&self, other: &Quantity) -> Format {
        if self.nanos == 0 {
            other.format
        } else {
            self.format
        }
    }
}

fn ceil_div(a: i128, b: i128) -> i128 {
    let q = a / b;
    if a % b != 0 && a > 0 { q + 1 } else { q }
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}
impl Eq for Quantity {}
impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }
}
impl Hash for Quantity {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.nanos.hash(state)
    }
}
impl Default for Quantity {
    fn default() -> Self {
        Quantity::ZERO
    }
}

/// Saturating arithmetic for convenience in sums; use the `checked_` forms where an overflow
/// must be reported.
impl Add for Quantity {
    type Output = Quantity;
    fn add(self, rhs: Quantity) -> Quantity {
        let nanos = self.nanos.saturating_add(rhs.nanos).clamp(-LIMIT, LIMIT);
        Quantity {
            nanos,
            format: self.pick_format(&rhs),
        }
    }
}
impl Sub for Quantity {
    type Output = Quantity;
    fn sub(self, rhs: Quantity) -> Quantity {
        let nanos = self.nanos.saturating_sub(rhs.nanos).clamp(-LIMIT, LIMIT);
        Quantity {
            nanos,
            format: self.pick_format(&rhs),
        }
    }
}
impl Neg for Quantity {
    type Output = Quantity;
    fn neg(self) -> Quantity {
        Quantity {
            nanos: -self.nanos,
            format: self.format,
        }
    }
}
impl std::iter::Sum for Quantity {
    fn sum<I: Iterator<Item = Quantity>>(iter: I) -> Quantity {
        iter.fold(Quantity::ZERO, |a, b| a + b)
    }
}

impl FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bytes = s.as_bytes();
        let mut i = 0;
        let negative = match bytes.first() {
            Some(b'-') => {
                i += 1;
                true
            }
            Some(b'+') => {
                i += 1;
                false
            }
            _ => false,
        };
        let int_start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        let int_part = &s[int_start..i];
        let mut frac_part = "";
        if i < bytes.len() && bytes[i] == b'.' {
            i += 1;
            let frac_start = i;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            frac_part = &s[frac_start..i];
        }
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(QuantityError::Format);
        }
        let (base, exp, format) = parse_suffix(&s[i..])?;

        // Significant digits as one integer; `frac_len` of them are after the point.
        let int_trim = int_part.trim_start_matches('0');
        let frac_trim = frac_part.trim_end_matches('0');
        let digits: String = [int_trim, frac_trim].concat();
        let digits = digits.trim_start_matches('0');
        let frac_len = frac_trim.len() as i32;
        if digits.len() > 36 {
            return Err(QuantityError::Range);
        }
        let mantissa: i128 = if digits.is_empty() {
            0
        } else {
            digits.parse().map_err(|_| QuantityError::Format)?
        };

        // value = mantissa * 10^-frac_len * base^exp; nanos = value * 10^9, rounded up.
        let magnitude = if base == 2 {
            let scaled = mantissa
                .checked_mul(pow(2, exp as u32).ok_or(QuantityError::Range)?)
                .ok_or(QuantityError::Range)?;
            shift10(scaled, 9 - frac_len)?
        } else {
            shift10(mantissa, 9 - frac_len + exp)?
        };
        if magnitude > LIMIT {
            return Err(QuantityError::Range);
        }
        Ok(Quantity {
            nanos: if negative { -magnitude } else { magnitude },
            format,
        })
    }
}

/// `v * 10^shift`, rounding a negative shift's lost digits up.
fn shift10(v: i128, shift: i32) -> Result<i128, QuantityError> {
    if shift >= 0 {
        if shift > 40 {
            return if v == 0 {
                Ok(0)
            } else {
                Err(QuantityError::Range)
            };
        }
        v.checked_mul(pow(10, shift as u32).ok_or(QuantityError::Range)?)
            .ok_or(QuantityError::Range)
    } else {
        let d = (-shift) as u32;
        if d > 38 {
            return Ok(if v == 0 { 0 } else { 1 });
        }
        let div = pow(10, d).ok_or(QuantityError::Range)?;
        Ok(ceil_div(v, div))
    }
}

fn pow(base: i128, exp: u32) -> Option<i128> {
    base.checked_pow(exp)
}

fn parse_suffix(suffix: &str) -> Result<(u32, i32, Format), QuantityError> {
    use Format::*;
    Ok(match suffix {
        "" => (10, 0, DecimalSI),
        "n" => (10, -9, DecimalSI),
        "u" => (10, -6, DecimalSI),
        "m" => (10, -3, DecimalSI),
        "k" => (10, 3, DecimalSI),
        "M" => (10, 6, DecimalSI),
        "G" => (10, 9, DecimalSI),
        "T" => (10, 12, DecimalSI),
        "P" => (10, 15, DecimalSI),
        "E" => (10, 18, DecimalSI),
        "Ki" => (2, 10, BinarySI),
        "Mi" => (2, 20, BinarySI),
        "Gi" => (2, 30, BinarySI),
        "Ti" => (2, 40, BinarySI),
        "Pi" => (2, 50, BinarySI),
        "Ei" => (2, 60, BinarySI),
        s if s.starts_with(['e', 'E']) => {
            let exp = &s[1..];
            let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || digits.len() > 4
            {
                return Err(QuantityError::Suffix);
            }
            let e: i32 = exp.parse().map_err(|_| QuantityError::Suffix)?;
            (10, e, DecimalExponent)
        }
        _ => return Err(QuantityError::Suffix),
    })
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nanos == 0 {
            return f.write_str("0");
        }
        let mut format = self.format;
        if format == Format::BinarySI && (self.nanos.abs() < 1024 * NANO || self.nanos % NANO != 0)
        {
            // Small or fractional binary quantities print in decimal, as Kubernetes does.
            format = Format::DecimalSI;
        }
        match format {
            Format::BinarySI => {
                let mut units = self.nanos / NANO;
                let mut exp = 0;
                while exp < 60 && units % 1024 == 0 {
                    units /= 1024;
                    exp += 10;
                }
                let suffix = match exp {
                    0 => "",
                    10 => "Ki",
                    20 => "Mi",
                    30 => "Gi",
                    40 => "Ti",
                    50 => "Pi",
                    _ => "Ei",
                };
                write!(f, "{units}{suffix}")
            }
            Format::DecimalSI | Format::DecimalExponent => {
                let mut mantissa = self.nanos;
                let mut exp: i32 = -9;
                while mantissa % 10 == 0 {
                    mantissa /= 10;
                    exp += 1;
                }
                match exp.rem_euclid(3) {
                    1 => {
                        mantissa *= 10;
                        exp -= 1;
                    }
                    2 => {
                        mantissa *= 100;
                        exp -= 2;
                    }
                    _ => {}
                }
                if format == Format::DecimalExponent || exp > 18 {
                    return if exp == 0 {
                        write!(f, "{mantissa}")
                    } else {
                        write!(f, "{mantissa}e{exp}")
                    };
                }
                let suffix = match exp {
                    -9 => "n",
                    -6 => "u",
                    -3 => "m",
                    0 => "",
                    3 => "k",
                    6 => "M",
                    9 => "G",
                    12 => "T",
                    15 => "P",
                    _ => "E",
                };
                write!(f, "{mantissa}{suffix}")
            }
        }
    }
}

/// Published as Kubernetes' own `Quantity` component, which servers and clients already know
/// (a string, or a number on input).
impl schemars::JsonSchema for Quantity {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Quantity".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "$ref": "#/components/schemas/io.k8s.apimachinery.pkg.api.resource.Quantity"
        })
    }
}

impl Serialize for Quantity {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Kubernetes accepts JSON numbers as well as strings.
        let v = serde_json::Value::deserialize(d)?;
        let s = match &v {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Number(n) => n.to_string(),
            _ => {
                return Err(serde::de::Error::custom(
                    "a quantity must be a string or a number",
                ));
            }
        };
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn parses_and_canonicalizes() {
        let cases = [
            ("0", "0", 0i128),
            ("500m", "500m", 500_000_000),
            ("0.5", "500m", 500_000_000),
            ("1", "1", NANO),
            ("1000m", "1", NANO),
            ("1500", "1500", 1500 * NANO),
            ("1000", "1k", 1000 * NANO),
            ("1k", "1k", 1000 * NANO),
            ("1Ki", "1Ki", 1024 * NANO),
            ("1Gi", "1Gi", (1 << 30) * NANO),
            ("1.5Gi", "1536Mi", 1536 * (1 << 20) * NANO),
            ("0.5Ki", "512", 512 * NANO),
            ("100Mi", "100Mi", 100 * (1 << 20) * NANO),
            ("2e3", "2e3", 2000 * NANO),
            ("2E3", "2e3", 2000 * NANO),
            ("1e-3", "1e-3", 1_000_000),
            ("12e2", "1200", 1200 * NANO),
            ("1n", "1n", 1),
            ("1u", "1u", 1000),
            ("0.1n", "1n", 1),
            ("-0.1n", "-1n", -1),
            ("-1.5", "-1500m", -1_500_000_000),
            ("+3", "3", 3 * NANO),
            (".5", "500m", 500_000_000),
            ("5.", "5", 5 * NANO),
            ("1M", "1M", 1_000_000 * NANO),
            ("1E", "1E", 1_000_000_000_000_000_000 * NANO),
            ("8Ei", "8Ei", (8i128 << 60) * NANO),
            ("007", "7", 7 * NANO),
            ("1023Ki", "1023Ki", 1023 * 1024 * NANO),
            ("1.0000000001", "1000000001n", 1_000_000_001),
        ];
        for (input, canonical, nanos) in cases {
            let v = q(input);
            assert_eq!(v.nanos(), nanos, "{input}");
            assert_eq!(v.to_string(), canonical, "{input}");
            // Canonical forms are fixed points.
            assert_eq!(
                q(canonical).to_string(),
                canonical,
                "{input} -> {canonical}"
            );
        }
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            "",
            "Gi",
            "1Gb",
            " 1",
            "1 ",
            "1.2.3",
            "--1",
            "e3",
            "1e",
            "1e+",
            "1ee3",
            "1k1",
            "abc",
            ".",
            "1e99999",
            "1e40",
            "1000000000000000000000000000000000000000",
        ] {
            assert!(
                bad.parse::<Quantity>().is_err(),
                "{bad:?} should be refused"
            );
        }
    }

    #[test]
    fn exact_arithmetic() {
        assert_eq!(q("100m") + q("200m"), q("300m"));
        assert_eq!((q("100m") + q("200m")).to_string(), "300m");
        assert_eq!(q("1Gi") - q("512Mi"), q("512Mi"));
        assert_eq!((q("1Gi") - q("512Mi")).to_string(), "512Mi");
        assert_eq!(q("250m").checked_mul(4).unwrap(), q("1"));
        assert_eq!(q("1").milli_value(), 1000);
        assert_eq!(q("1500m").value(), 2, "rounds up");
        assert_eq!(q("-1500m").value(), -1);
        assert_eq!(q("32").fits(&q("3")), Some(10));
        assert_eq!(q("32").fits(&q("0")), None);
        assert!(q("1Gi") > q("1G"));
        assert_eq!(
            vec![q("1"), q("2"), q("500m")]
                .into_iter()
                .sum::<Quantity>(),
            q("3.5")
        );
        // 0.1 + 0.2 is exactly 0.3, unlike floating point.
        assert_eq!(q("0.1") + q("0.2"), q("0.3"));
        let big = q("800Ei");
        assert!(big.checked_mul(1_000_000_000).is_none());
        assert!(big.checked_mul(1_000).is_some());
    }

    #[test]
    fn serde_accepts_numbers_and_strings() {
        let v: Quantity = serde_json::from_str("\"2Gi\"").unwrap();
        assert_eq!(v.to_string(), "2Gi");
        let v: Quantity = serde_json::from_str("0.25").unwrap();
        assert_eq!(v.to_string(), "250m");
        assert_eq!(serde_json::to_string(&q("1.5Gi")).unwrap(), "\"1536Mi\"");
        assert!(serde_json::from_str::<Quantity>("true").is_err());
        assert!(serde_json::from_str::<Quantity>("\"x\"").is_err());
    }
}
