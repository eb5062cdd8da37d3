//! Kubernetes' semver library (`k8s.io/apiserver/pkg/cel/library/semverlib.go`, version 1):
//! `semver(s)`, `semver(s, normalize)`, `isSemver(s)`, `isSemver(s, normalize)`, and on a version
//! `major()`, `minor()`, `patch()`, `isLessThan`, `isGreaterThan`, `compareTo`; `==` compares
//! precedence (build metadata ignored), as Kubernetes' does.
//!
//! With `normalize`, a leading `v` is dropped, leading zeros are removed and a missing minor or
//! patch is `0` (`v01.01` is `1.1.0`); a short version may not carry pre-release or build data.
use std::cmp::Ordering;

use ::cel::common::types::{BOOL_TYPE, CelBool, CelInt, Kind, STRING_TYPE, Type};
use ::cel::common::value::{CowVal, Val};
use ::cel::{DeclarationError, Env, ExecutionError};
use semver::Version;

use super::lists::take;
use super::opaque::opaque_val;

const SEMVER_TYPE_NAME: &str = "kubernetes.Semver";
static SEMVER_TYPE: Type = semver_type();

/// `Type` is not `Clone`: each registration takes its own.
const fn semver_type() -> Type {
    Type::simple_type(Kind::Opaque, SEMVER_TYPE_NAME)
}

/// A version, as `semver()` returns it.
#[derive(Clone, Debug)]
pub struct Semver(Version);

impl Semver {
    pub fn parse(text: &str, normalize: bool) -> Result<Semver, String> {
        let text = if normalize {
            normalized(text)?
        } else {
            text.to_string()
        };
        Version::parse(&text).map(Semver).map_err(|e| e.to_string())
    }
}

/// Kubernetes' `normalizeAndParse`, before the parse.
fn normalized(text: &str) -> Result<String, String> {
    let text = text.strip_prefix('v').unwrap_or(text);
    let mut parts: Vec<String> = text.splitn(3, '.').map(str::to_string).collect();
    for part in &mut parts {
        if part.len() > 1 {
            let trimmed = part.trim_start_matches('0');
            *part = if trimmed.starts_with(|c: char| c.is_ascii_digit()) {
                trimmed.to_string()
            } else {
                format!("0{trimmed}")
            };
        }
    }
    if parts.len() < 3 {
        if parts.last().is_some_and(|p| p.contains(['+', '-'])) {
            return Err("short version cannot contain PreRelease/Build meta data".into());
        }
        parts.resize(3, "0".into());
    }
    Ok(parts.join("."))
}

opaque_val!(Semver, SEMVER_TYPE, |a, b| a.0.cmp_precedence(&b.0)
    == Ordering::Equal);

fn version<'a>(val: &'a dyn Val, function: &str) -> Result<&'a Semver, ExecutionError> {
    val.as_any()
        .and_then(|a| a.downcast_ref::<Semver>())
        .ok_or_else(|| ExecutionError::function_error(function, "not a semver"))
}

/// The string and the `normalize` flag of `semver()` and `isSemver()`.
fn text_and_flag<'a>(
    args: &'a [CowVal<'_, '_>],
    function: &str,
) -> Result<(&'a str, bool), ExecutionError> {
    let text = args
        .first()
        .and_then(|a| <&str>::try_from(a.as_ref()).ok())
        .ok_or_else(|| ExecutionError::function_error(function, "not a string"))?;
    let normalize = match args.get(1) {
        None => false,
        Some(flag) => *flag
            .as_any()
            .and_then(|a| a.downcast_ref::<CelBool>())
            .ok_or_else(|| ExecutionError::function_error(function, "not a bool"))?
            .inner(),
    };
    Ok((text, normalize))
}

/// Registers the library on `env`.
pub fn library(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_type(semver_type())?;
    env.add_overload("semver", "string_to_semver", vec![STRING_TYPE], semver)?;
    env.add_overload(
        "semver",
        "string_bool_to_semver",
        vec![STRING_TYPE, BOOL_TYPE],
        semver,
    )?;
    env.add_overload("isSemver", "is_semver_string", vec![STRING_TYPE], is_semver)?;
    env.add_overload(
        "isSemver",
        "is_semver_string_bool",
        vec![STRING_TYPE, BOOL_TYPE],
        is_semver,
    )?;
    for (name, args, op) in [
        (
            "isGreaterThan",
            vec![semver_type()],
            is_greater_than as ::cel::common::functions::Function,
        ),
        ("isLessThan", vec![semver_type()], is_less_than),
        ("compareTo", vec![semver_type()], compare_to),
        ("major", vec![], major),
        ("minor", vec![], minor),
        ("patch", vec![], patch),
    ] {
        env.add_member_overload(name, &format!("semver.{name}"), semver_type(), args, op)?;
    }
    Ok(())
}

fn semver<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (text, normalize) = text_and_flag(&args, "semver")?;
    let parsed =
        Semver::parse(text, normalize).map_err(|e| ExecutionError::function_error("semver", e))?;
    Ok(CowVal::owned(parsed))
}

fn is_semver<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (text, normalize) = text_and_flag(&args, "isSemver")?;
    Ok(CowVal::owned(CelBool::from(
        Semver::parse(text, normalize).is_ok(),
    )))
}

fn ordering<'b, 'v>(args: Vec<CowVal<'b, 'v>>, function: &str) -> Result<Ordering, ExecutionError> {
    let [this, other] = take(args)?;
    Ok(version(this.as_ref(), function)?
        .0
        .cmp_precedence(&version(other.as_ref(), function)?.0))
}

fn is_greater_than<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let greater = ordering(args, "isGreaterThan")? == Ordering::Greater;
    Ok(CowVal::owned(CelBool::from(greater)))
}

fn is_less_than<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let less = ordering(args, "isLessThan")? == Ordering::Less;
    Ok(CowVal::owned(CelBool::from(less)))
}

fn compare_to<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let order = ordering(args, "compareTo")? as i64;
    Ok(CowVal::owned(CelInt::from(order)))
}

fn part<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
    function: &str,
    of: fn(&Version) -> u64,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [this] = take(args)?;
    let value = of(&version(this.as_ref(), function)?.0);
    let value = i64::try_from(value).map_err(|e| ExecutionError::function_error(function, e))?;
    Ok(CowVal::owned(CelInt::from(value)))
}

fn major<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    part(args, "major", |v| v.major)
}

fn minor<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    part(args, "minor", |v| v.minor)
}

fn patch<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    part(args, "patch", |v| v.patch)
}
