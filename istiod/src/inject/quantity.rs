//! Canonical spelling of Kubernetes resource quantities.
//!
//! The API server (and Istio's typed Go round trip) stores `2000m` as `"2"` and `1024Mi` as
//! `"1Gi"`; the injected pod must carry the same spelling so that it reads as Istio's does.
//! No maintained crate implements `resource.Quantity`'s canonical form, hence this small port
//! of its rules for the inputs a sidecar's resources use (integers and decimals with an SI or
//! binary suffix).

/// The canonical form of `q`, or `q` unchanged when it is not a quantity this module reads.
pub fn canonical(q: &str) -> String {
    parse(q).map(render).unwrap_or_else(|| q.to_string())
}

enum Parsed {
    /// An amount in units of 10^-9.
    Decimal(i128),
    /// An amount in bytes (whole units) with a binary suffix.
    Binary(i128),
}

fn parse(q: &str) -> Option<Parsed> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let (negative, num) = match num.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, num.strip_prefix('+').unwrap_or(num)),
    };
    let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
    if int_part.is_empty() && frac_part.is_empty() {
        return None;
    }
    if frac_part.len() > 9 || !frac_part.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let int: i128 = if int_part.is_empty() {
        0
    } else {
        int_part.parse().ok()?
    };
    let frac: i128 = if frac_part.is_empty() {
        0
    } else {
        format!("{frac_part:0<9}").parse().ok()?
    };
    let nanos = int.checked_mul(1_000_000_000)?.checked_add(frac)?;
    let sign = if negative { -1 } else { 1 };
    let binary = |pow: u32| -> Option<Parsed> {
        let scaled = nanos.checked_mul(1024i128.pow(pow))?;
        if scaled % 1_000_000_000 != 0 {
            // A fractional byte count: Kubernetes falls back to decimal.
            return Some(Parsed::Decimal(sign * scaled));
        }
        Some(Parsed::Binary(sign * scaled / 1_000_000_000))
    };
    let decimal = |exp: i32| -> Option<Parsed> {
        let v = if exp >= 0 {
            nanos.checked_mul(10i128.pow(exp as u32))?
        } else {
            let d = 10i128.pow((-exp) as u32);
            if nanos % d != 0 {
                return None;
            }
            nanos / d
        };
        Some(Parsed::Decimal(sign * v))
    };
    match suffix {
        "Ki" => binary(1),
        "Mi" => binary(2),
        "Gi" => binary(3),
        "Ti" => binary(4),
        "Pi" => binary(5),
        "Ei" => binary(6),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "" => decimal(0),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        _ => None,
    }
}

fn render(p: Parsed) -> String {
    match p {
        Parsed::Binary(bytes) => {
            if bytes == 0 {
                return "0".to_string();
            }
            let suffixes = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
            let mut v = bytes;
            let mut i = 0;
            while i + 1 < suffixes.len() && v % 1024 == 0 {
                v /= 1024;
                i += 1;
            }
            if i == 0 {
                // Not a multiple of 1Ki: Kubernetes writes it as a plain (decimal) integer.
                return render(Parsed::Decimal(bytes * 1_000_000_000));
            }
            format!("{v}{}", suffixes[i])
        }
        Parsed::Decimal(nanos) => {
            if nanos == 0 {
                return "0".to_string();
            }
            // Exponents in steps of 3, from nano up; pick the largest that keeps an integer.
            let suffixes = ["n", "u", "m", "", "k", "M", "G", "T", "P", "E"];
            let mut v = nanos;
            let mut i = 0;
            while i + 1 < suffixes.len() && v % 1000 == 0 {
                v /= 1000;
                i += 1;
            }
            format!("{v}{}", suffixes[i])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::canonical;

    #[test]
    fn canonical_forms_match_kubernetes() {
        assert_eq!(canonical("2000m"), "2");
        assert_eq!(canonical("100m"), "100m");
        assert_eq!(canonical("1024Mi"), "1Gi");
        assert_eq!(canonical("128Mi"), "128Mi");
        assert_eq!(canonical("0.5"), "500m");
        assert_eq!(canonical("1000"), "1k");
        assert_eq!(canonical("0"), "0");
        assert_eq!(canonical("3000m"), "3");
        assert_eq!(canonical("bogus"), "bogus");
    }
}
