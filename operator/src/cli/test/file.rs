//! The test file, `gatehouse-test.yaml`: which Policies, which resources, the Namespaces'
//! labels, the request, and what each Policy should make of each resource. Read strictly: an
//! unknown field or a wrong value is an error naming its field path, never a silently
//! different test.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::cli::documents::DocumentsError;
use gatehouse_api::v1alpha1::Operation;
use gatehouse_engine::admission::UserInfo;

/// The `apiVersion` of a test file: a file for the command line, not a cluster resource.
pub const API_VERSION: &str = "cli.gatehouse.dev/v1alpha1";
/// The `kind` of a test file.
pub const KIND: &str = "Test";
/// The name `gatehouse test` looks for under its folders.
pub const FILE_NAME: &str = "gatehouse-test.yaml";

/// One test file.
#[derive(Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TestFile {
    /// `cli.gatehouse.dev/v1alpha1`.
    pub api_version: String,
    /// `Test`.
    pub kind: String,
    #[serde(default)]
    pub metadata: Metadata,
    /// Policy files or folders, relative to the test file; a folder's YAML and JSON files are
    /// read (not its subfolders), and documents that are not Policies are passed over.
    pub policies: Vec<PathBuf>,
    /// Resource files or folders, relative to the test file: every document is a resource.
    pub resources: Vec<PathBuf>,
    /// The Namespaces' labels, for namespaceSelectors; a Namespace not listed has none.
    #[serde(default)]
    pub namespaces: Vec<NamespaceLabels>,
    /// The request every resource comes in by, unless a result says otherwise.
    #[serde(default)]
    pub request: RequestSpec,
    /// What each Policy should make of each resource.
    pub results: Vec<Expectation>,
}

/// The test's name.
#[derive(Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    #[serde(default)]
    pub name: String,
}

/// A Namespace and its labels.
#[derive(Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NamespaceLabels {
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// How a resource reaches admission.
#[derive(Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RequestSpec {
    /// CREATE (the default), UPDATE, DELETE or CONNECT.
    #[serde(default)]
    pub operation: Option<Operation>,
    /// The request's namespace: the resource's (`default` for a namespaced one without) when
    /// absent.
    #[serde(default)]
    pub namespace: Option<String>,
    /// The request's `resource` (or `resource/subresource`): guessed from the kind when absent.
    #[serde(default)]
    pub resource: Option<String>,
    /// Who asks, for match conditions reading `request.userInfo`.
    #[serde(default)]
    pub user_info: Option<UserInfo>,
    /// The stored object an UPDATE replaces (a file, relative to the test file); the resource
    /// itself when absent (an UPDATE that changes nothing).
    #[serde(default)]
    pub old_resource: Option<PathBuf>,
}

/// What a Policy should make of some resources.
#[derive(Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Expectation {
    /// The Policy's name.
    pub policy: String,
    /// The resources: `name`, or `namespace/name` where names repeat.
    pub resources: Vec<String>,
    pub result: Expected,
    /// Denied: text the Policy's denial contains. Warned: text one of its warnings contains.
    #[serde(default)]
    pub message: Option<String>,
    /// The object as it would be stored, after every mutating Policy of the test (a file,
    /// relative to the test file).
    #[serde(default)]
    pub patched_resource: Option<PathBuf>,
    /// The JSON Patch this Policy alone makes of the resource.
    #[serde(default)]
    pub patches: Option<Vec<Value>>,
    /// This result's request, instead of the file's.
    #[serde(default)]
    pub request: Option<RequestSpec>,
}

/// What a Policy makes of a request.
#[derive(Deserialize, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Expected {
    /// It matched and let the request through (mutated or not), without a warning.
    Admitted,
    /// It denied the request.
    Denied,
    /// It let the request through with a warning.
    Warned,
    /// It did not match.
    Skipped,
}

impl Expected {
    pub fn as_str(self) -> &'static str {
        match self {
            Expected::Admitted => "admitted",
            Expected::Denied => "denied",
            Expected::Warned => "warned",
            Expected::Skipped => "skipped",
        }
    }
}

/// Why a test file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error(transparent)]
    Documents(#[from] DocumentsError),
    #[error("{}: {field}: {message}", .path.display())]
    Field {
        path: PathBuf,
        field: String,
        message: String,
    },
}

/// Reads and checks the test file at `path`.
pub fn read(path: &Path) -> Result<TestFile, FileError> {
    let mut documents = crate::cli::documents::documents(path)?;
    let field = |field: &str, message: String| FileError::Field {
        path: path.to_path_buf(),
        field: field.to_string(),
        message,
    };
    if documents.len() != 1 {
        return Err(field(
            "(document)",
            format!("want one Test document, found {}", documents.len()),
        ));
    }
    let document = documents.remove(0);
    let test: TestFile = serde_path_to_error::deserialize(document).map_err(|e| {
        let at = e.path().to_string();
        field(
            if at == "." { "(document)" } else { &at },
            e.into_inner().to_string(),
        )
    })?;
    if test.api_version != API_VERSION || test.kind != KIND {
        return Err(field(
            "apiVersion",
            format!(
                "{:?}/{:?} is not a {API_VERSION} {KIND}",
                test.api_version, test.kind
            ),
        ));
    }
    check(&test).map_err(|(at, message)| field(&at, message))?;
    Ok(test)
}

/// What the types cannot say: lists that must not be empty, and a result's fields that go
/// together.
fn check(test: &TestFile) -> Result<(), (String, String)> {
    for (list, empty) in [
        ("policies", test.policies.is_empty()),
        ("resources", test.resources.is_empty()),
        ("results", test.results.is_empty()),
    ] {
        if empty {
            return Err((list.to_string(), "must not be empty".to_string()));
        }
    }
    for (i, result) in test.results.iter().enumerate() {
        let at = |field: &str| format!("results[{i}].{field}");
        if result.resources.is_empty() {
            return Err((at("resources"), "must not be empty".to_string()));
        }
        let mutation = result.patched_resource.is_some() || result.patches.is_some();
        if mutation && !matches!(result.result, Expected::Admitted | Expected::Warned) {
            return Err((
                at("result"),
                "patchedResource and patches need a result that stores the object: admitted \
                 or warned"
                    .to_string(),
            ));
        }
        let request = result.request.as_ref().unwrap_or(&test.request);
        if let Some(at_request) = request_problem(request, mutation) {
            let prefix = if result.request.is_some() {
                format!("results[{i}].request")
            } else {
                "request".to_string()
            };
            return Err((format!("{prefix}.{}", at_request.0), at_request.1));
        }
        if result.message.is_some() && !matches!(result.result, Expected::Denied | Expected::Warned)
        {
            return Err((
                at("message"),
                "only a denied or warned result has a message".to_string(),
            ));
        }
    }
    Ok(())
}

/// What a request's details cannot mean, by field: a DELETE's object is the resource itself (it
/// has no `oldResource`, and nothing of it is stored).
fn request_problem(request: &RequestSpec, mutation: bool) -> Option<(&'static str, String)> {
    if request.operation != Some(Operation::Delete) {
        return None;
    }
    if request.old_resource.is_some() {
        return Some((
            "oldResource",
            "a DELETE reviews the resource itself: oldResource is for UPDATE".to_string(),
        ));
    }
    mutation.then(|| {
        (
            "operation",
            "a DELETE stores nothing: patchedResource and patches are for CREATE and UPDATE"
                .to_string(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `read` of `text` written to a scratch file: the error's text, or the test.
    fn read_text(tag: &str, text: &str) -> Result<TestFile, String> {
        let path = std::env::temp_dir().join(format!(
            "gatehouse-test-file-{tag}-{}.yaml",
            std::process::id()
        ));
        std::fs::write(&path, text).map_err(|e| e.to_string())?;
        let read = read(&path).map_err(|e| e.to_string());
        let _ = std::fs::remove_file(&path);
        read
    }

    const HEAD: &str = "apiVersion: cli.gatehouse.dev/v1alpha1\nkind: Test\npolicies: [p.yaml]\nresources: [r.yaml]\n";

    #[test]
    fn a_good_file_reads() {
        let test = read_text(
            "good",
            &format!("{HEAD}results:\n- {{policy: p, resources: [a, ns/b], result: denied, message: forbidden}}\n"),
        )
        .expect("reads");
        assert_eq!(test.results[0].result, Expected::Denied);
        assert_eq!(test.results[0].resources, ["a", "ns/b"]);
        assert_eq!(test.request, RequestSpec::default());
    }

    #[test]
    fn every_mistake_names_its_field() {
        let cases = [
            // A typo is an unknown field, not a silently empty list.
            (format!("{HEAD}result: []\n"), "result"),
            (
                format!("{HEAD}results:\n- {{policy: p, resources: [a], result: allowed}}\n"),
                "results[0].result: unknown variant `allowed`",
            ),
            (
                format!(
                    "{HEAD}results:\n- {{policy: p, resources: [a], result: denied, patches: []}}\n"
                ),
                "results[0].result: patchedResource and patches need",
            ),
            (
                format!(
                    "{HEAD}results:\n- {{policy: p, resources: [a], result: admitted, message: x}}\n"
                ),
                "results[0].message: only a denied or warned result",
            ),
            (
                format!("{HEAD}results:\n- {{policy: p, resources: [], result: admitted}}\n"),
                "results[0].resources: must not be empty",
            ),
            (format!("{HEAD}results: []\n"), "results: must not be empty"),
            (
                format!(
                    "{HEAD}request: {{operation: DELETE, oldResource: o.yaml}}\nresults:\n- {{policy: p, resources: [a], result: denied}}\n"
                ),
                "request.oldResource: a DELETE reviews the resource itself",
            ),
            (
                format!(
                    "{HEAD}results:\n- {{policy: p, resources: [a], result: admitted, patches: [], request: {{operation: DELETE}}}}\n"
                ),
                "results[0].request.operation: a DELETE stores nothing",
            ),
            (
                format!("{HEAD}request: {{operation: PATCH}}\nresults: []\n"),
                "request.operation",
            ),
            (
                "apiVersion: v1\nkind: Test\npolicies: [p]\nresources: [r]\nresults: []\n"
                    .to_string(),
                "apiVersion: \"v1\"/\"Test\" is not a cli.gatehouse.dev/v1alpha1 Test",
            ),
        ];
        for (i, (text, want)) in cases.iter().enumerate() {
            let err = read_text(&format!("bad{i}"), text).expect_err(text);
            assert!(err.contains(want), "{text}\n=> {err}\nwant {want}");
        }
    }
}
