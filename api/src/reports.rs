//! Policy reports in the two formats policy engines write and Policy Reporter reads: the
//! Kubernetes Policy working group's `wgpolicyk8s.io/v1alpha2` PolicyReport and
//! ClusterPolicyReport, and their successor `openreports.io/v1alpha1` Report and ClusterReport
//! (Kyverno and Kubewarden have moved to it). Gatehouse writes them (the audit of stored
//! objects) and can generate their CRDs for clusters that have none (`gatehouse crds --reports`
//! and `--openreports`, the opt-in `config/reports` and `config/openreports` components).
//!
//! Both formats have the same fields at the top level of the object, beside `metadata`, not
//! under a `spec`; so these are plain types and the CRDs are built here rather than derived.
use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceColumnDefinition, CustomResourceDefinition, CustomResourceDefinitionNames,
    CustomResourceDefinitionSpec, CustomResourceDefinitionVersion, CustomResourceValidation,
    JSONSchemaProps,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API a report is written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ReportApi {
    /// `wgpolicyk8s.io/v1alpha2`: PolicyReport, ClusterPolicyReport.
    Wgpolicyk8s,
    /// `openreports.io/v1alpha1`: Report, ClusterReport.
    Openreports,
}

impl ReportApi {
    pub const ALL: [ReportApi; 2] = [ReportApi::Wgpolicyk8s, ReportApi::Openreports];

    pub fn group(self) -> &'static str {
        match self {
            ReportApi::Wgpolicyk8s => "wgpolicyk8s.io",
            ReportApi::Openreports => "openreports.io",
        }
    }

    pub fn version(self) -> &'static str {
        match self {
            ReportApi::Wgpolicyk8s => "v1alpha2",
            ReportApi::Openreports => "v1alpha1",
        }
    }

    /// `group/version`.
    pub fn api_version(self) -> String {
        format!("{}/{}", self.group(), self.version())
    }

    /// The kind of `kind`'s reports in this API.
    pub fn kind(self, kind: ReportKind) -> &'static str {
        match (self, kind) {
            (ReportApi::Wgpolicyk8s, ReportKind::Namespaced) => "PolicyReport",
            (ReportApi::Wgpolicyk8s, ReportKind::Cluster) => "ClusterPolicyReport",
            (ReportApi::Openreports, ReportKind::Namespaced) => "Report",
            (ReportApi::Openreports, ReportKind::Cluster) => "ClusterReport",
        }
    }

    /// The resource (plural) of `kind`'s reports in this API.
    pub fn plural(self, kind: ReportKind) -> &'static str {
        match (self, kind) {
            (ReportApi::Wgpolicyk8s, ReportKind::Namespaced) => "policyreports",
            (ReportApi::Wgpolicyk8s, ReportKind::Cluster) => "clusterpolicyreports",
            (ReportApi::Openreports, ReportKind::Namespaced) => "reports",
            (ReportApi::Openreports, ReportKind::Cluster) => "clusterreports",
        }
    }

    fn short_name(self, kind: ReportKind) -> &'static str {
        match (self, kind) {
            (ReportApi::Wgpolicyk8s, ReportKind::Namespaced) => "polr",
            (ReportApi::Wgpolicyk8s, ReportKind::Cluster) => "cpolr",
            (ReportApi::Openreports, ReportKind::Namespaced) => "reps",
            (ReportApi::Openreports, ReportKind::Cluster) => "creps",
        }
    }
}

/// A reference to the object a result is about.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ResourceReference {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
}

/// When a result was found.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
pub struct Timestamp {
    pub seconds: i64,
    pub nanos: i32,
}

/// The outcome of one rule on one object.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ResultKind {
    Pass,
    Fail,
    Warn,
    Error,
    Skip,
}

/// One rule's result on one object.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReportResult {
    /// The engine that produced the result: `gatehouse`.
    pub source: String,
    /// The Policy.
    pub policy: String,
    /// The rule: `validate[<index>]`.
    pub rule: String,
    /// `fail` for a violated Deny rule, `warn` for a violated Warn rule, `error` when the rule
    /// could not be evaluated.
    pub result: ResultKind,
    /// `high` for Deny rules, `medium` for Warn rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub severity: Option<String>,
    /// The rule's message.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The object.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<ResourceReference>,
    /// When the audit pass that found it ran.
    pub timestamp: Timestamp,
    /// Whether the result counts toward a score.
    pub scored: bool,
    /// More about the result.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub properties: BTreeMap<String, String>,
}

/// How many results of each kind the audit found (all of them, also when `results` is capped).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
pub struct ReportSummary {
    pub pass: u64,
    pub fail: u64,
    pub warn: u64,
    pub error: u64,
    pub skip: u64,
}

/// The fields of a report beside its `metadata`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
pub struct ReportBody {
    /// The counts of every result, listed or not.
    pub summary: ReportSummary,
    /// The failing results (fail, warn, error), at most the cap per report.
    #[serde(default)]
    pub results: Vec<ReportResult>,
}

/// The two report kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReportKind {
    /// Per namespace: results about its objects.
    Namespaced,
    /// Results about cluster-scoped objects.
    Cluster,
}

/// The CRD of `kind`'s reports in `api`, with the summary counts as printer columns.
pub fn report_crd(api: ReportApi, kind: ReportKind) -> CustomResourceDefinition {
    let body = serde_json::to_value(schemars::schema_for!(ReportBody)).unwrap_or_default();
    let mut schema = inline_definitions(&body);
    if let Some(fields) = schema.get_mut("properties").and_then(|p| p.as_object_mut()) {
        fields.insert("apiVersion".into(), serde_json::json!({"type": "string"}));
        fields.insert("kind".into(), serde_json::json!({"type": "string"}));
        fields.insert("metadata".into(), serde_json::json!({"type": "object"}));
    }
    if let Some(o) = schema.as_object_mut() {
        let description = match kind {
            ReportKind::Namespaced => {
                "The results of policy checks on the objects of one namespace"
            }
            ReportKind::Cluster => "The results of policy checks on cluster-scoped objects",
        };
        o.insert(
            "description".into(),
            format!("{description} ({}).", api.group()).into(),
        );
        o.remove("$schema");
        o.remove("title");
        o.remove("required");
        o.remove("$defs");
    }
    let schema: JSONSchemaProps = serde_json::from_value(schema).unwrap_or_default();
    let column = |name: &str, path: &str| CustomResourceColumnDefinition {
        name: name.into(),
        type_: "integer".into(),
        json_path: path.into(),
        ..Default::default()
    };
    CustomResourceDefinition {
        metadata: ObjectMeta {
            name: Some(format!("{}.{}", api.plural(kind), api.group())),
            ..Default::default()
        },
        spec: CustomResourceDefinitionSpec {
            group: api.group().into(),
            names: CustomResourceDefinitionNames {
                kind: api.kind(kind).into(),
                plural: api.plural(kind).into(),
                singular: Some(api.kind(kind).to_lowercase()),
                short_names: Some(vec![api.short_name(kind).into()]),
                list_kind: Some(format!("{}List", api.kind(kind))),
                ..Default::default()
            },
            scope: match kind {
                ReportKind::Namespaced => "Namespaced".into(),
                ReportKind::Cluster => "Cluster".into(),
            },
            versions: vec![CustomResourceDefinitionVersion {
                name: api.version().into(),
                served: true,
                storage: true,
                schema: Some(CustomResourceValidation {
                    open_api_v3_schema: Some(schema),
                }),
                additional_printer_columns: Some(vec![
                    column("Pass", ".summary.pass"),
                    column("Fail", ".summary.fail"),
                    column("Warn", ".summary.warn"),
                    column("Error", ".summary.error"),
                    column("Skip", ".summary.skip"),
                    CustomResourceColumnDefinition {
                        name: "Age".into(),
                        type_: "date".into(),
                        json_path: ".metadata.creationTimestamp".into(),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }],
            ..Default::default()
        },
        status: None,
    }
}

/// `schema` with every `$ref` to its `$defs` replaced by the definition (a CRD schema may not
/// refer), `Option`'s `null` type dropped (a CRD field is optional by being absent).
fn inline_definitions(schema: &serde_json::Value) -> serde_json::Value {
    let definitions = schema
        .get("$defs")
        .cloned()
        .unwrap_or(serde_json::Value::Null);
    fn walk(node: &serde_json::Value, definitions: &serde_json::Value) -> serde_json::Value {
        match node {
            serde_json::Value::Object(fields) => {
                if let Some(target) = fields
                    .get("$ref")
                    .and_then(|r| r.as_str())
                    .and_then(|r| r.strip_prefix("#/$defs/"))
                    .and_then(|name| definitions.get(name))
                {
                    let mut inlined = walk(target, definitions);
                    if let (Some(o), Some(d)) = (inlined.as_object_mut(), fields.get("description"))
                    {
                        o.insert("description".into(), d.clone());
                    }
                    return inlined;
                }
                let mut out = serde_json::Map::new();
                for (key, value) in fields {
                    match (key.as_str(), value) {
                        ("type", serde_json::Value::Array(types)) => {
                            let first = types.iter().find(|t| t.as_str() != Some("null"));
                            out.insert(key.clone(), first.cloned().unwrap_or_default());
                        }
                        ("format" | "default" | "$defs", _) => {}
                        _ => {
                            out.insert(key.clone(), walk(value, definitions));
                        }
                    }
                }
                serde_json::Value::Object(out)
            }
            serde_json::Value::Array(items) => {
                serde_json::Value::Array(items.iter().map(|i| walk(i, definitions)).collect())
            }
            other => other.clone(),
        }
    }
    walk(schema, &definitions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crds_are_structural_with_the_counts_as_columns() {
        let crd = report_crd(ReportApi::Wgpolicyk8s, ReportKind::Namespaced);
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("policyreports.wgpolicyk8s.io")
        );
        let open = report_crd(ReportApi::Openreports, ReportKind::Cluster);
        assert_eq!(
            open.metadata.name.as_deref(),
            Some("clusterreports.openreports.io")
        );
        assert_eq!(open.spec.names.kind, "ClusterReport");
        assert_eq!(open.spec.versions[0].name, "v1alpha1");
        let yaml = serde_json::to_string(&crd).unwrap();
        assert!(!yaml.contains("$ref") && !yaml.contains("$defs"), "{yaml}");
        let version = &crd.spec.versions[0];
        let columns: Vec<&str> = version
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(columns, ["Pass", "Fail", "Warn", "Error", "Skip", "Age"]);
        let schema = version
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .unwrap();
        let props = schema.properties.as_ref().unwrap();
        assert!(props.contains_key("summary") && props.contains_key("results"));
        let result = props["results"]
            .items
            .as_ref()
            .map(|i| serde_json::to_value(i).unwrap())
            .unwrap();
        assert_eq!(
            result["properties"]["result"]["enum"],
            serde_json::json!(["pass", "fail", "warn", "error", "skip"])
        );
        assert_eq!(
            report_crd(ReportApi::Wgpolicyk8s, ReportKind::Cluster)
                .spec
                .scope,
            "Cluster".to_string()
        );
    }
}
