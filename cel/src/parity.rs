//! The parity corpus (`cel/testdata/parity.txt`) through Gatehouse: every case has the
//! outcome the corpus states, which the e2e suite checks against kube-apiserver.
use serde_json::json;

use super::{Activation, CelError, Site, compile, eval_bool, refusals};

/// The corpus, shared with the e2e suite.
const CORPUS: &str = include_str!("../testdata/parity.txt");

/// What Gatehouse makes of `source`: refused when written, or the result of evaluating it.
fn outcome(source: &str) -> Result<Result<bool, CelError>, String> {
    let program = compile(source).map_err(|e| e.to_string())?;
    let problems = refusals(&program, Site::Validation).map_err(|e| e.to_string())?;
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    // What the e2e suite creates: a ConfigMap named `probe`.
    let object = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "probe"}});
    let request = json!({"operation": "CREATE"});
    Ok(eval_bool(
        &program,
        &Activation::new(Some(&object), None, &request),
    ))
}

#[test]
fn every_case_has_the_outcome_the_corpus_states() {
    let mut cases = 0;
    let mut disagreements = Vec::new();
    for line in CORPUS
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (expected, source) = line.split_once(' ').expect("`<outcome> <expression>`");
        let got = outcome(source);
        let agrees = match expected {
            "true" => got == Ok(Ok(true)),
            "error" => matches!(got, Ok(Err(CelError::Execute(_)))),
            "refused" => got.is_err(),
            other => panic!("unknown outcome {other:?} in {line:?}"),
        };
        if !agrees {
            disagreements.push(format!("{line}: Gatehouse says {got:?}"));
        }
        cases += 1;
    }
    assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));
    assert!(cases >= 150, "only {cases} cases");
}
