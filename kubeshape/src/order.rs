//! How names sort for people: `pod-2` before `pod-10`, in the hub's lists and the
//! cluster-agent's cache alike.

use std::cmp::Ordering;

/// Text order with runs of digits compared by value ("pod-2" before "pod-10"), as people
/// expect of names and of cells such as "2 (5m ago)".
pub fn natural(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    loop {
        match (a.first(), b.first()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let run = |s: &[u8]| s.iter().take_while(|c| c.is_ascii_digit()).count();
                let (ra, rb) = (run(a), run(b));
                let digits_a = strip_zeros(&a[..ra]);
                let digits_b = strip_zeros(&b[..rb]);
                let by_value = digits_a
                    .len()
                    .cmp(&digits_b.len())
                    .then_with(|| digits_a.cmp(digits_b));
                if by_value != Ordering::Equal {
                    return by_value;
                }
                a = &a[ra..];
                b = &b[rb..];
            }
            (Some(x), Some(y)) => {
                let by_char = x.cmp(y);
                if by_char != Ordering::Equal {
                    return by_char;
                }
                a = &a[1..];
                b = &b[1..];
            }
        }
    }
}

fn strip_zeros(digits: &[u8]) -> &[u8] {
    let zeros = digits.iter().take_while(|d| **d == b'0').count();
    &digits[zeros..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natural_order_compares_digit_runs_by_value() {
        let mut names = ["pod-10", "pod-2", "pod-1", "pod-02x", "pod-", "pod-1a"];
        names.sort_by(|a, b| natural(a, b));
        assert_eq!(
            names,
            ["pod-", "pod-1", "pod-1a", "pod-2", "pod-02x", "pod-10"]
        );
    }
}
