//! cel-go's strings and lists extensions at the versions Kubernetes enables: strings version 2
//! and lists version 3, from the `cel` crate.
//!
//! Where the crate's strings extension differs from cel-go's, the call is expanded when written
//! into an internal function of the same meaning as cel-go's (the crate cannot drop an overload):
//!
//! * `reverse()` on strings came with strings version 3, so the API server has it on lists
//!   only: `x.reverse()` becomes `@reverse(x)`, which reverses a list and refuses anything else;
//! * `indexOf(s, offset)` and `lastIndexOf(s, offset)` answer `-1` for an offset past the end
//!   (the crate fails): they become `@indexOf(x, s, offset)` and `@lastIndexOf(x, s, offset)`.
use ::cel::common::ast::{CallExpr, Expr};
use ::cel::common::types::{CelInt, CelList, CelString, DYN_TYPE, INT_TYPE, Kind, STRING_TYPE};
use ::cel::common::value::{CowVal, Val};
use ::cel::parser::Macro;
use ::cel::{DeclarationError, Env, ExecutionError};

use super::lists::{elements, take};

/// The function `x.reverse()` is expanded into; `@` keeps it out of what a Policy can write.
pub const REVERSE: &str = "@reverse";
/// The function `x.indexOf(s, offset)` is expanded into.
pub const INDEX_OF: &str = "@indexOf";
/// The function `x.lastIndexOf(s, offset)` is expanded into.
pub const LAST_INDEX_OF: &str = "@lastIndexOf";

/// The member call an internal function stands for, as written: its name and argument count
/// (the receiver not counted).
const EXPANSIONS: [(&str, &str, usize); 3] = [
    (REVERSE, "reverse", 0),
    (INDEX_OF, "indexOf", 2),
    (LAST_INDEX_OF, "lastIndexOf", 2),
];

/// The member function `internal` (one of this module's) was written as.
pub fn written_as(internal: &str) -> Option<&'static str> {
    EXPANSIONS
        .iter()
        .find(|(name, _, _)| *name == internal)
        .map(|(_, member, _)| *member)
}

/// Registers both extensions and the expansions.
pub fn library(env: &mut Env) -> Result<(), DeclarationError> {
    ::cel::extensions::strings(env)?;
    ::cel::extensions::lists(env)?;
    for (internal, member, count) in EXPANSIONS {
        env.add_macro(Macro::receiver(
            member,
            count,
            move |helper, target, args| {
                // A receiver macro is only ever called with its receiver.
                let Some(receiver) = target.take() else {
                    return Err(helper.new_error(0, format!("{member}() needs a receiver")));
                };
                let mut call_args = vec![receiver];
                call_args.append(args);
                Ok(Some(helper.next_expr(Expr::Call(CallExpr {
                    func_name: internal.to_string(),
                    target: None,
                    args: call_args,
                }))))
            },
        ))?;
    }
    env.add_overload(REVERSE, "@reverse_dyn", vec![DYN_TYPE], reverse)?;
    env.add_overload(
        INDEX_OF,
        "@indexOf_string_string_int",
        vec![STRING_TYPE, STRING_TYPE, INT_TYPE],
        index_of,
    )?;
    env.add_overload(
        LAST_INDEX_OF,
        "@lastIndexOf_string_string_int",
        vec![STRING_TYPE, STRING_TYPE, INT_TYPE],
        last_index_of,
    )
}

/// The receiver, needle and offset of an `indexOf`/`lastIndexOf` call, as characters.
fn search_args(
    args: Vec<CowVal<'_, '_>>,
    function: &str,
) -> Result<(Vec<char>, Vec<char>, i64), ExecutionError> {
    let [receiver, needle, offset] = take(args)?;
    let text = |v: &CowVal<'_, '_>| {
        v.downcast_ref::<CelString<'_>>()
            .map(|s| s.inner().chars().collect::<Vec<char>>())
            .ok_or_else(|| ExecutionError::function_error(function, "not a string"))
    };
    let offset = offset
        .downcast_ref::<CelInt>()
        .map(|i| *i.inner())
        .ok_or_else(|| ExecutionError::function_error(function, "offset is not an int"))?;
    if offset < 0 {
        return Err(ExecutionError::function_error(
            function,
            format!("index out of range: {offset}"),
        ));
    }
    Ok((text(&receiver)?, text(&needle)?, offset))
}

/// An offset past the end leaves nothing to search: the empty string is found at the end,
/// anything else nowhere.
fn past_the_end(text: &[char], needle: &[char], offset: usize) -> Option<i64> {
    if needle.is_empty() {
        return Some(int_of(offset.min(text.len())));
    }
    (offset >= text.len()).then_some(-1)
}

fn int_of(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (text, needle, offset) = search_args(args, "indexOf")?;
    let offset = usize::try_from(offset).unwrap_or(usize::MAX);
    let found = past_the_end(&text, &needle, offset).unwrap_or_else(|| {
        (offset..=text.len().saturating_sub(needle.len()))
            .find(|&i| text[i..].starts_with(&needle))
            .map_or(-1, int_of)
    });
    Ok(CowVal::Owned(Box::new(CelInt::from(found))))
}

fn last_index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (text, needle, offset) = search_args(args, "lastIndexOf")?;
    let offset = usize::try_from(offset).unwrap_or(usize::MAX);
    let found = past_the_end(&text, &needle, offset).unwrap_or_else(|| {
        if needle.len() > text.len() {
            return -1;
        }
        (0..=offset.min(text.len() - needle.len()))
            .rev()
            .find(|&i| text[i..].starts_with(&needle))
            .map_or(-1, int_of)
    });
    Ok(CowVal::Owned(Box::new(CelInt::from(found))))
}

fn reverse<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [receiver] = take(args)?;
    let receiver: &(dyn Val + '_) = receiver.as_ref();
    if receiver.get_type().kind() != Kind::List {
        return Err(ExecutionError::no_such_member_overload(
            "reverse",
            vec![receiver.get_type().name().to_owned()],
        ));
    }
    let mut items: Vec<Box<dyn Val + 'v>> = elements(receiver, "reverse")?
        .into_iter()
        .map(|item| item.clone_as_boxed())
        .collect();
    items.reverse();
    Ok(CowVal::Owned(Box::new(CelList::from(items))))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::{Activation, compile, eval_bool};

    fn eval(source: &str) -> Result<bool, String> {
        let object = json!({"spec": {"name": "abc", "items": [1, 2, 3]}});
        let request = json!({});
        let program = compile(source).map_err(|e| e.to_string())?;
        eval_bool(&program, &Activation::new(Some(&object), None, &request))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn reverse_is_a_list_function_only() {
        assert_eq!(eval("[1, 2, 3].reverse() == [3, 2, 1]"), Ok(true));
        assert_eq!(
            eval("object.spec.items.reverse().reverse() == object.spec.items"),
            Ok(true)
        );
        let refused = eval("object.spec.name.reverse() == 'cba'").unwrap_err();
        assert!(refused.contains("reverse"), "{refused}");
        // The rest of strings version 2 is there.
        assert_eq!(eval("object.spec.name.upperAscii() == 'ABC'"), Ok(true));
    }
}
