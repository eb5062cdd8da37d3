//! cel-go's strings and lists extensions at the versions Kubernetes enables: strings version 2
//! and lists version 3, from the `cel` crate.
//!
//! The crate's strings extension also declares `reverse()` on strings, which cel-go added in
//! strings version 3, so the API server has it only on lists. The crate cannot drop an overload,
//! so `x.reverse()` is expanded, when written, into `@reverse(x)`, which reverses a list and
//! refuses anything else, as the API server does.
use ::cel::common::ast::{CallExpr, Expr};
use ::cel::common::types::{CelList, DYN_TYPE, Kind};
use ::cel::common::value::{CowVal, Val};
use ::cel::parser::Macro;
use ::cel::{DeclarationError, Env, ExecutionError};

use super::lists::{elements, take};

/// The function `x.reverse()` is expanded into; `@` keeps it out of what a Policy can write.
pub const REVERSE: &str = "@reverse";

/// Registers both extensions, and `reverse()` for lists only.
pub fn library(env: &mut Env) -> Result<(), DeclarationError> {
    ::cel::extensions::strings(env)?;
    ::cel::extensions::lists(env)?;
    env.add_macro(Macro::receiver("reverse", 0, |helper, target, _args| {
        let Some(receiver) = target.take() else {
            return Err(helper.new_error(0, "reverse() needs a receiver"));
        };
        Ok(Some(helper.next_expr(Expr::Call(CallExpr {
            func_name: REVERSE.to_string(),
            target: None,
            args: vec![receiver],
        }))))
    }))?;
    env.add_overload(REVERSE, "@reverse_dyn", vec![DYN_TYPE], reverse)
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

    use crate::engine::cel::{Activation, compile, eval_bool};

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
