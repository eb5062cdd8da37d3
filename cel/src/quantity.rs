//! Kubernetes' quantity library (`k8s.io/apiserver/pkg/cel/library/quantity.go`): `quantity()`
//! and `isQuantity()` on strings, and on a quantity `isLessThan`, `isGreaterThan`, `compareTo`,
//! `add`, `sub` (a quantity or an int), `asInteger`, `isInteger` and `asApproximateFloat`, and
//! `sign(q)`; `==` compares values (`quantity('200M') == quantity('0.2G')`).
//!
//! A quantity is kept exactly, as an integer times a power of ten, so that arithmetic and
//! comparisons on the quantities Kubernetes accepts (`9999999999999999999999999999999999999G`
//! included) never round.
use std::cmp::Ordering;

use ::cel::common::types::{CelBool, CelDouble, CelInt, INT_TYPE, Kind, STRING_TYPE, Type};
use ::cel::common::value::{CowVal, Val};
use ::cel::{DeclarationError, Env, ExecutionError};
use num_bigint::BigInt;
use num_traits::{Signed, ToPrimitive, Zero};

use super::lists::take;
use super::opaque::opaque_val;

const QUANTITY_TYPE_NAME: &str = "kubernetes.Quantity";
static QUANTITY_TYPE: Type = quantity_type();

/// The quantity type (`Type` is not `Clone`; each registration takes its own).
const fn quantity_type() -> Type {
    Type::simple_type(Kind::Opaque, QUANTITY_TYPE_NAME)
}

/// Largest power of ten a quantity may carry; Kubernetes' own quantities stay far inside it.
const MAX_EXPONENT: u32 = 1000;
/// Most digits a quantity may have.
const MAX_DIGITS: usize = 1000;

/// `mantissa × 10^exponent`.
#[derive(Clone, Debug)]
pub struct Quantity {
    mantissa: BigInt,
    exponent: i32,
}

impl Quantity {
    /// Parses Kubernetes' quantity syntax: a signed decimal number and one suffix, binary
    /// (`Ki` … `Ei`), decimal (`n u m k M G T P E`) or an exponent (`e3`, `E-2`).
    pub fn parse(text: &str) -> Option<Quantity> {
        let number_end = text
            .char_indices()
            .find(|(i, c)| {
                !(c.is_ascii_digit() || *c == '.' || (*i == 0 && (*c == '+' || *c == '-')))
            })
            .map_or(text.len(), |(i, _)| i);
        let (number, suffix) = text.split_at(number_end);
        let (negative, digits) = match number.as_bytes().first() {
            Some(b'-') => (true, &number[1..]),
            Some(b'+') => (false, &number[1..]),
            _ => (false, number),
        };
        let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
        if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
            return None;
        }
        let all_digits = format!("{whole}{fraction}");
        let mut mantissa: BigInt = all_digits.parse().ok()?;
        let mut exponent = -i32::try_from(fraction.len()).ok()?;
        match suffix {
            "" => {}
            "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" => {
                let power = 1 + ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
                    .iter()
                    .position(|s| *s == suffix)?;
                mantissa <<= 10 * power;
            }
            "n" | "u" | "m" | "k" | "M" | "G" | "T" | "P" | "E" => {
                exponent += match suffix {
                    "n" => -9,
                    "u" => -6,
                    "m" => -3,
                    "k" => 3,
                    "M" => 6,
                    "G" => 9,
                    "T" => 12,
                    "P" => 15,
                    _ => 18,
                };
            }
            _ => {
                let power = suffix.strip_prefix(['e', 'E'])?;
                let valid = power.strip_prefix(['+', '-']).unwrap_or(power);
                if valid.is_empty() || !valid.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                exponent = exponent.checked_add(power.parse::<i32>().ok()?)?;
            }
        }
        if negative {
            mantissa = -mantissa;
        }
        // Aligning two quantities multiplies by ten to the difference of their exponents: bound
        // it, so that `1e2000000000` is refused instead of stalling admission.
        if exponent.unsigned_abs() > MAX_EXPONENT || all_digits.len() > MAX_DIGITS {
            return None;
        }
        Some(Quantity { mantissa, exponent })
    }

    /// Both mantissas at the smaller exponent.
    fn aligned(&self, other: &Quantity) -> (BigInt, BigInt, i32) {
        let exponent = self.exponent.min(other.exponent);
        let scale =
            |q: &Quantity| &q.mantissa * BigInt::from(10).pow(q.exponent.abs_diff(exponent));
        (scale(self), scale(other), exponent)
    }

    fn compare(&self, other: &Quantity) -> Ordering {
        let (a, b, _) = self.aligned(other);
        a.cmp(&b)
    }

    fn plus(&self, other: &Quantity) -> Quantity {
        let (a, b, exponent) = self.aligned(other);
        Quantity {
            mantissa: a + b,
            exponent,
        }
    }

    fn negated(&self) -> Quantity {
        Quantity {
            mantissa: -&self.mantissa,
            exponent: self.exponent,
        }
    }

    fn of_int(value: i64) -> Quantity {
        Quantity {
            mantissa: BigInt::from(value),
            exponent: 0,
        }
    }

    /// The value as an `i64`, when it is a whole number that fits.
    fn as_i64(&self) -> Option<i64> {
        if self.exponent >= 0 {
            (&self.mantissa * BigInt::from(10).pow(self.exponent.unsigned_abs())).to_i64()
        } else {
            let divisor = BigInt::from(10).pow(self.exponent.unsigned_abs());
            (&self.mantissa % &divisor)
                .is_zero()
                .then(|| &self.mantissa / divisor)?
                .to_i64()
        }
    }

    fn as_f64(&self) -> f64 {
        self.mantissa.to_f64().unwrap_or(f64::NAN) * 10f64.powi(self.exponent)
    }
}

opaque_val!(Quantity, QUANTITY_TYPE, |a, b| a.compare(b)
    == Ordering::Equal);

fn quantity_of(val: &dyn Val) -> Option<&Quantity> {
    val.as_any()?.downcast_ref::<Quantity>()
}

fn string_of(val: &dyn Val) -> Option<&str> {
    <&str>::try_from(val).ok()
}

/// The receiver, a quantity, of a call of `function`.
fn receiver<'a>(val: &'a dyn Val, function: &str) -> Result<&'a Quantity, ExecutionError> {
    quantity_of(val).ok_or_else(|| ExecutionError::function_error(function, "not a quantity"))
}

/// A quantity argument, or an int taken as one.
fn operand(val: &dyn Val, function: &str) -> Result<Quantity, ExecutionError> {
    if let Some(q) = quantity_of(val) {
        return Ok(q.clone());
    }
    val.as_any()
        .and_then(|a| a.downcast_ref::<CelInt>())
        .map(|i| Quantity::of_int(*i.inner()))
        .ok_or_else(|| ExecutionError::function_error(function, "not a quantity or an int"))
}

/// Registers the library on `env`.
pub fn library(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_type(quantity_type())?;
    env.add_overload(
        "quantity",
        "string_to_quantity",
        vec![STRING_TYPE],
        quantity,
    )?;
    env.add_overload(
        "isQuantity",
        "is_quantity_string",
        vec![STRING_TYPE],
        is_quantity,
    )?;
    // `sign(q)`, not `q.sign()`: Kubernetes declares it as a global function.
    env.add_overload("sign", "quantity_sign", vec![quantity_type()], sign)?;
    let members: [(&str, Vec<Type>, ::cel::common::functions::Function); 10] = [
        ("isLessThan", vec![quantity_type()], is_less_than),
        ("isGreaterThan", vec![quantity_type()], is_greater_than),
        ("compareTo", vec![quantity_type()], compare_to),
        ("add", vec![quantity_type()], add),
        ("add", vec![INT_TYPE], add),
        ("sub", vec![quantity_type()], sub),
        ("sub", vec![INT_TYPE], sub),
        ("asInteger", vec![], as_integer),
        ("isInteger", vec![], is_integer),
        ("asApproximateFloat", vec![], as_approximate_float),
    ];
    for (name, args, op) in members {
        let id = format!("quantity.{name}({})", args.len());
        let id = if args.first() == Some(&INT_TYPE) {
            format!("{id}_int")
        } else {
            id
        };
        env.add_member_overload(name, &id, quantity_type(), args, op)?;
    }
    Ok(())
}

fn quantity<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [text] = take(args)?;
    let text = string_of(text.as_ref())
        .ok_or_else(|| ExecutionError::function_error("quantity", "not a string"))?;
    let q = Quantity::parse(text).ok_or_else(|| {
        ExecutionError::function_error("quantity", format!("quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {text:?}"))
    })?;
    Ok(CowVal::owned(q))
}

fn is_quantity<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [text] = take(args)?;
    let valid = string_of(text.as_ref()).is_some_and(|t| Quantity::parse(t).is_some());
    Ok(CowVal::owned(CelBool::from(valid)))
}

fn ordering<'b, 'v>(args: Vec<CowVal<'b, 'v>>, function: &str) -> Result<Ordering, ExecutionError> {
    let [this, other] = take(args)?;
    Ok(receiver(this.as_ref(), function)?.compare(receiver(other.as_ref(), function)?))
}

fn is_less_than<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let less = ordering(args, "isLessThan")? == Ordering::Less;
    Ok(CowVal::owned(CelBool::from(less)))
}

fn is_greater_than<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let greater = ordering(args, "isGreaterThan")? == Ordering::Greater;
    Ok(CowVal::owned(CelBool::from(greater)))
}

fn compare_to<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let order = ordering(args, "compareTo")? as i64;
    Ok(CowVal::owned(CelInt::from(order)))
}

fn add<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [this, other] = take(args)?;
    let sum = receiver(this.as_ref(), "add")?.plus(&operand(other.as_ref(), "add")?);
    Ok(CowVal::owned(sum))
}

fn sub<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [this, other] = take(args)?;
    let difference =
        receiver(this.as_ref(), "sub")?.plus(&operand(other.as_ref(), "sub")?.negated());
    Ok(CowVal::owned(difference))
}

fn as_integer<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [this] = take(args)?;
    let value = receiver(this.as_ref(), "asInteger")?
        .as_i64()
        .ok_or_else(|| {
            ExecutionError::function_error("asInteger", "cannot convert value to integer")
        })?;
    Ok(CowVal::owned(CelInt::from(value)))
}

fn is_integer<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [this] = take(args)?;
    let fits = receiver(this.as_ref(), "isInteger")?.as_i64().is_some();
    Ok(CowVal::owned(CelBool::from(fits)))
}

fn as_approximate_float<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [this] = take(args)?;
    let value = receiver(this.as_ref(), "asApproximateFloat")?.as_f64();
    Ok(CowVal::owned(CelDouble::from(value)))
}

fn sign<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [this] = take(args)?;
    let q = receiver(this.as_ref(), "sign")?;
    let sign = if q.mantissa.is_zero() {
        0
    } else if q.mantissa.is_negative() {
        -1
    } else {
        1
    };
    Ok(CowVal::owned(CelInt::from(sign)))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::{Activation, CelError, compile, eval_bool};

    fn eval(source: &str) -> Result<bool, CelError> {
        let object = json!({"spec": {"containers": [
            {"name": "a", "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}}},
            {"name": "b", "resources": {"limits": {"cpu": "2", "memory": "1Gi"}}},
        ]}});
        let request = json!({"operation": "CREATE"});
        eval_bool(
            &compile(source)?,
            &Activation::new(Some(&object), None, &request),
        )
    }

    /// k8s.io/apiserver v0.37.2 `pkg/cel/library/quantity_test.go`, as boolean expressions.
    #[test]
    fn answers_as_kubernetes_does() {
        for source in [
            "quantity('12Mi') == quantity('12582912')",
            "isQuantity('20')",
            "isQuantity('20M')",
            "isQuantity('20Mi')",
            "!isQuantity('20Mo')",
            "!isQuantity('10Mm')",
            "quantity('200M') == quantity('200M')",
            "quantity('200M') == quantity('0.2G') && quantity('0.2G') == quantity('200M')",
            "quantity('2M') == quantity('0.002G') && quantity('2000k') == quantity('2M') && quantity('0.002G') == quantity('2000k')",
            "!(quantity('200M') == quantity('0.3G'))",
            "quantity('50M').isLessThan(quantity('50Mi'))",
            "quantity('50M').isLessThan(quantity('100M'))",
            "!quantity('100M').isLessThan(quantity('50M'))",
            "quantity('50Mi').isGreaterThan(quantity('50M'))",
            "quantity('150Mi').isGreaterThan(quantity('100Mi'))",
            "!quantity('50M').isGreaterThan(quantity('100M'))",
            "quantity('200M').compareTo(quantity('0.2G')) == 0",
            "quantity('50M').compareTo(quantity('50Mi')) == -1",
            "quantity('50Mi').compareTo(quantity('50M')) == 1",
            "quantity('50k').add(quantity('20')) == quantity('50.02k')",
            "!quantity('50k').add(20).isLessThan(quantity('50020'))",
            "quantity('50k').sub(quantity('20')) == quantity('49.98k')",
            "quantity('50k').sub(20) == quantity('49980')",
            "quantity('50k').add(20).sub(quantity('100k')).asInteger() == -49980",
            "quantity('50k').add(20).sub(quantity('100k')).sub(-50000).asInteger() == 20",
            "quantity('50k').asInteger() == 50000",
            "!quantity('9999999999999999999999999999999999999G').isInteger()",
            "quantity('50').isInteger()",
            "quantity('50.703k').asApproximateFloat() == 50703.0",
            "[quantity('9999999999999999999999999999999999999')].all(x, x.add(quantity('1')).compareTo(x.add(quantity('2'))) == -1)",
            "sign(quantity('-1')) == -1 && sign(quantity('0')) == 0 && sign(quantity('1m')) == 1",
            "quantity('1e3') == quantity('1k') && quantity('1E-3') == quantity('1m')",
            // The seed's rule: every container's limits within bounds.
            "object.spec.containers.all(c, quantity(c.resources.limits.memory).compareTo(quantity('2Gi')) <= 0)",
            "!object.spec.containers.all(c, quantity(c.resources.limits.cpu).isLessThan(quantity('1')))",
        ] {
            assert_eq!(eval(source), Ok(true), "{source}");
        }
    }

    #[test]
    fn refuses_what_kubernetes_refuses() {
        for (source, reason) in [
            ("quantity('10Mo') == quantity('1')", "quantities must match"),
            ("quantity('10Mm') == quantity('1')", "quantities must match"),
            // Bounded, so that comparing never computes a power of ten of that size.
            (
                "quantity('1e2000000000').compareTo(quantity('1')) == 1",
                "quantities must match",
            ),
            (
                "quantity('9999999999999999999999999999999999999G').asInteger() == 1",
                "cannot convert value to integer",
            ),
        ] {
            match eval(source) {
                Err(CelError::Execute(message)) => {
                    assert!(message.contains(reason), "{source}: {message}")
                }
                other => panic!("{source}: {other:?}"),
            }
        }
    }
}
