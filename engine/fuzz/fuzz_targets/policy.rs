//! A Policy as `kubectl apply` may send it (YAML or JSON): validation and compilation never
//! panic, and they agree (a Policy compiles exactly when validation finds no problem).
#![no_main]

use gatehouse_api::v1alpha1::Policy;
use gatehouse_engine::{compile, validate};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(policy) = serde_saphyr::from_str::<Policy>(text) else { return };
    let problems = validate(&policy);
    let compiled = compile(&policy);
    assert_eq!(
        problems.is_empty(),
        compiled.is_ok(),
        "validate and compile disagree: {problems:?}"
    );
});
