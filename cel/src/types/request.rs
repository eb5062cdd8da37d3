//! The type Kubernetes declares for `request` in admission expressions (`BuildRequestType`,
//! k8s.io/apiserver v0.37.2 `pkg/admission/plugin/cel/compile.go`): an object type with these
//! fields and no others, so that `request.uid` or `request.name + 1` is refused when written.

/// The type of `request`.
pub(super) const REQUEST: &str = "kubernetes.AdmissionRequest";

/// The fields of the object type `type_name`, each with its type as
/// [`super::signatures::SIGNATURES`] writes types; `None` for a type that is not one of these.
pub(super) fn fields(type_name: &str) -> Option<&'static [(&'static str, &'static str)]> {
    Some(match type_name {
        REQUEST => &[
            ("kind", "kubernetes.GroupVersionKind"),
            ("resource", "kubernetes.GroupVersionResource"),
            ("subResource", "string"),
            ("requestKind", "kubernetes.GroupVersionKind"),
            ("requestResource", "kubernetes.GroupVersionResource"),
            ("requestSubResource", "string"),
            ("name", "string"),
            ("namespace", "string"),
            ("operation", "string"),
            ("userInfo", "kubernetes.UserInfo"),
            ("dryRun", "bool"),
            ("options", "dyn"),
        ],
        "kubernetes.GroupVersionKind" => &[
            ("group", "string"),
            ("version", "string"),
            ("kind", "string"),
        ],
        "kubernetes.GroupVersionResource" => &[
            ("group", "string"),
            ("version", "string"),
            ("resource", "string"),
        ],
        "kubernetes.UserInfo" => &[
            ("username", "string"),
            ("uid", "string"),
            ("groups", "list(string)"),
            ("extra", "map(string, list(string))"),
        ],
        _ => return None,
    })
}
