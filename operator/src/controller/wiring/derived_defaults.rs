//! Defaults the API server computes from other fields of the object.
//!
//! The object a mutation sees is defaulted already, so a default only fires between two
//! mutations when one of them made its condition true: wrote the field it is copied from (a
//! container's `resources.limits`, which `resources.requests` copies when absent), or removed
//! the field it sets. Then a later mutation that reads or writes either field may do something
//! else in-process (defaulted in between) than on the webhook path (defaulted once, after the
//! last): setting `requests` only when absent, or overwriting `limits` after `requests` was
//! copied from the old value. So a mutation that writes where such a default reads or sets
//! counts every field of the default as defaulted ([`Footprint::appends`]).
//!
//! The table lists, by group and resource, the defaults of the built-in kinds that read another
//! field or another field's presence (the `SetDefaults_*` functions of Kubernetes 1.37 whose
//! value is not a constant, and those behind gates that are on by default). Custom resources
//! are defaulted only with constants from their schemas.
use super::defaulting::{ELEMENT, Footprint, Path};

/// The OpenAPI schema names of the built-in types with a defaulting function of their own
/// (`SetDefaults_<Type>` in Kubernetes 1.37): a struct of one of these a merge creates gets
/// defaults the schema does not show (a `Probe` its `periodSeconds`, an `HTTPGetAction` its
/// `path` and `scheme`).
pub const DEFAULTED_TYPES: &[&str] = &[
    "io.k8s.api.admissionregistration.v1.ValidatingWebhook",
    "io.k8s.api.admissionregistration.v1.MutatingWebhook",
    "io.k8s.api.admissionregistration.v1.Rule",
    "io.k8s.api.admissionregistration.v1.ServiceReference",
    "io.k8s.api.admissionregistration.v1.ValidatingAdmissionPolicySpec",
    "io.k8s.api.admissionregistration.v1.MatchResources",
    "io.k8s.api.admissionregistration.v1.MutatingAdmissionPolicySpec",
    "io.k8s.api.authentication.v1.TokenRequestSpec",
    "io.k8s.api.batch.v1.PodFailurePolicyOnPodConditionsPattern",
    "io.k8s.api.core.v1.Volume",
    "io.k8s.api.core.v1.Container",
    "io.k8s.api.core.v1.EphemeralContainer",
    "io.k8s.api.core.v1.PodSpec",
    "io.k8s.api.core.v1.Probe",
    "io.k8s.api.core.v1.SecretVolumeSource",
    "io.k8s.api.core.v1.ConfigMapVolumeSource",
    "io.k8s.api.core.v1.DownwardAPIVolumeSource",
    "io.k8s.api.core.v1.ProjectedVolumeSource",
    "io.k8s.api.core.v1.ServiceAccountTokenProjection",
    "io.k8s.api.core.v1.PersistentVolumeClaimSpec",
    "io.k8s.api.core.v1.HTTPGetAction",
    "io.k8s.api.core.v1.ObjectFieldSelector",
    "io.k8s.api.core.v1.LimitRangeItem",
    "io.k8s.api.core.v1.HostPathVolumeSource",
    "io.k8s.api.discovery.v1.EndpointPort",
    "io.k8s.api.flowcontrol.v1.FlowSchemaSpec",
    "io.k8s.api.flowcontrol.v1.ExemptPriorityLevelConfiguration",
    "io.k8s.api.flowcontrol.v1.LimitedPriorityLevelConfiguration",
    "io.k8s.api.flowcontrol.v1.QueuingConfiguration",
    "io.k8s.api.networking.v1.NetworkPolicyPort",
    "io.k8s.api.rbac.v1.Subject",
    "io.k8s.api.resource.v1.ExactDeviceRequest",
    "io.k8s.api.resource.v1.DeviceSubRequest",
    "io.k8s.api.resource.v1.DeviceTaint",
    "io.k8s.api.autoscaling.v2.HorizontalPodAutoscalerBehavior",
];

/// One default computed from other fields.
struct Derived {
    group: &'static str,
    resources: &'static [&'static str],
    /// Every field it reads or sets, dotted, `[]` after an array's key for its elements.
    fields: &'static [&'static str],
}

/// The Pod spec's derived defaults, below a Pod's `spec`: each the fields one default reads and
/// sets.
const POD_SPEC: &[&[&str]] = &[
    &[
        "containers[].resources.limits",
        "containers[].resources.requests",
    ],
    &[
        "initContainers[].resources.limits",
        "initContainers[].resources.requests",
    ],
    &[
        "hostNetwork",
        "containers[].ports[].containerPort",
        "containers[].ports[].hostPort",
        "initContainers[].ports[].containerPort",
        "initContainers[].ports[].hostPort",
    ],
    &["containers[].image", "containers[].imagePullPolicy"],
    &["initContainers[].image", "initContainers[].imagePullPolicy"],
    &[
        "ephemeralContainers[].image",
        "ephemeralContainers[].imagePullPolicy",
    ],
    &["serviceAccountName", "serviceAccount"],
    &["volumes[]"],
];

const DERIVED: &[Derived] = &[
    Derived {
        group: "",
        resources: &["pods"],
        // And POD_SPEC below `spec`.
        fields: &["status.podIP", "status.podIPs"],
    },
    Derived {
        group: "",
        resources: &["services"],
        fields: &[
            "spec.ports[].port",
            "spec.ports[].targetPort",
            "spec.sessionAffinity",
            "spec.sessionAffinityConfig",
            "spec.type",
            "spec.externalIPs",
            "spec.externalTrafficPolicy",
            "spec.internalTrafficPolicy",
            "spec.allocateLoadBalancerNodePorts",
        ],
    },
    Derived {
        group: "",
        resources: &["replicationcontrollers"],
        fields: &[
            "spec.template.metadata.labels",
            "spec.selector",
            "metadata.labels",
        ],
    },
    Derived {
        group: "",
        resources: &["limitranges"],
        fields: &["spec.limits[]"],
    },
    Derived {
        group: "",
        resources: &["nodes"],
        fields: &["status.capacity", "status.allocatable"],
    },
    Derived {
        group: "apps",
        resources: &["deployments"],
        fields: &["spec.strategy"],
    },
    Derived {
        group: "apps",
        resources: &["daemonsets", "statefulsets"],
        fields: &["spec.updateStrategy"],
    },
    Derived {
        group: "batch",
        resources: &["jobs"],
        fields: &[
            "spec.completions",
            "spec.parallelism",
            "spec.backoffLimit",
            "spec.backoffLimitPerIndex",
            "spec.podFailurePolicy",
            "spec.podReplacementPolicy",
            "spec.template.metadata.labels",
            "metadata.labels",
        ],
    },
    Derived {
        group: "autoscaling",
        resources: &["horizontalpodautoscalers"],
        fields: &["spec.metrics", "spec.behavior"],
    },
    Derived {
        group: "networking.k8s.io",
        resources: &["networkpolicies"],
        fields: &["spec.egress", "spec.policyTypes"],
    },
    Derived {
        group: "networking.k8s.io",
        resources: &["ingressclasses"],
        fields: &["spec.parameters"],
    },
    Derived {
        group: "rbac.authorization.k8s.io",
        resources: &["rolebindings", "clusterrolebindings"],
        fields: &["subjects[]"],
    },
    Derived {
        group: "resource.k8s.io",
        resources: &["resourceclaims"],
        fields: &["spec.devices.requests[]"],
    },
    Derived {
        group: "resource.k8s.io",
        resources: &["resourceclaimtemplates"],
        fields: &["spec.spec.devices.requests[]"],
    },
];

/// Where each kind holding a Pod spec template holds it: the service account alias is defaulted
/// in templates too, the rest of [`POD_SPEC`] only in Pods.
const TEMPLATES: &[(&str, &str, &str)] = &[
    ("", "podtemplates", "template.spec"),
    ("", "replicationcontrollers", "spec.template.spec"),
    ("apps", "deployments", "spec.template.spec"),
    ("apps", "replicasets", "spec.template.spec"),
    ("apps", "statefulsets", "spec.template.spec"),
    ("apps", "daemonsets", "spec.template.spec"),
    ("batch", "jobs", "spec.template.spec"),
    ("batch", "cronjobs", "spec.jobTemplate.spec.template.spec"),
];

/// A dotted field as a [`Path`]: `a[].b` is `a`, `[]`, `b`.
fn path_of(dotted: &str) -> Path {
    let mut path = Path::new();
    for key in dotted.split('.') {
        match key.strip_suffix("[]") {
            Some(array) => {
                path.push(array.to_string());
                path.push(ELEMENT.to_string());
            }
            None => path.push(key.to_string()),
        }
    }
    path
}

/// The derived defaults' fields, one group of fields a default reads and sets at a time, for
/// a kind given by group and resource (`*` in either matches all).
fn coupled_fields(group: &str, resource: &str) -> Vec<Vec<Path>> {
    let matches = |g: &str, r: &str| {
        (group == "*" || group == g) && (resource == "*" || resource == r || resource == "*/*")
    };
    let mut groups: Vec<Vec<Path>> = DERIVED
        .iter()
        .filter(|d| d.resources.iter().any(|r| matches(d.group, r)))
        .map(|d| d.fields.iter().map(|f| path_of(f)).collect())
        .collect();
    if matches("", "pods") {
        for fields in POD_SPEC {
            groups.push(
                fields
                    .iter()
                    .map(|f| path_of(&format!("spec.{f}")))
                    .collect(),
            );
        }
    }
    for (g, r, spec) in TEMPLATES {
        if matches(g, r) {
            groups.push(vec![
                path_of(&format!("{spec}.serviceAccountName")),
                path_of(&format!("{spec}.serviceAccount")),
            ]);
        }
    }
    groups
}

/// Whether one path lies within the other (or they are equal).
fn nested(a: &Path, b: &Path) -> bool {
    let n = a.len().min(b.len());
    a[..n] == b[..n]
}

/// Adds to `fp.appends` the fields of every derived default of the kinds `kinds` (group,
/// resource) that `fp` writes or appends near: the API server may compute them before the next
/// mutation runs.
pub fn add_derived_defaults(fp: &mut Footprint, kinds: &[(&str, &str)]) {
    let mut added: Vec<Path> = Vec::new();
    for (group, resource) in kinds {
        for fields in coupled_fields(group, resource) {
            let touched = fp
                .writes
                .iter()
                .chain(&fp.appends)
                .any(|w| fields.iter().any(|f| nested(w, f)));
            if touched {
                added.extend(fields);
            }
        }
    }
    for path in added {
        if !fp.appends.contains(&path) {
            fp.appends.push(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::controller::wiring::defaulting::{footprint, interacts};
    use gatehouse_api::v1alpha1::Mutation;

    fn fp(merge: serde_json::Value, for_each: Option<&str>, kinds: &[(&str, &str)]) -> Footprint {
        let mut fp = footprint(&Mutation {
            for_each: for_each.map(str::to_string),
            merge,
            ..Mutation::default()
        });
        add_derived_defaults(&mut fp, kinds);
        fp
    }

    #[test]
    fn limits_written_before_requests_are_set_interact_in_pods_only() {
        let pods = [("", "pods")];
        let limits = fp(
            json!({"resources": {"limits": {"cpu": "1"}}}),
            Some("spec.containers"),
            &pods,
        );
        let requests = fp(
            json!({"resources": {"requests": {"cpu": "500m"}}}),
            Some("spec.containers"),
            &pods,
        );
        assert!(interacts(&limits, &requests));
        // A later overwrite of the limits keeps requests copied from the first.
        assert!(interacts(&limits, &limits));
        // Labels have no derived default.
        let label = fp(json!({"metadata": {"labels": {"a": "b"}}}), None, &pods);
        assert!(!interacts(&limits, &label) && !interacts(&label, &limits));
        // A ConfigMap has no such default (and no such field).
        let in_config_maps = fp(
            json!({"resources": {"limits": {"cpu": "1"}}}),
            Some("spec.containers"),
            &[("", "configmaps")],
        );
        assert!(!interacts(&in_config_maps, &requests));
    }

    #[test]
    fn host_network_couples_every_host_port_and_templates_couple_the_service_account() {
        let host = fp(json!({"spec": {"hostNetwork": true}}), None, &[("", "*")]);
        let port = fp(
            json!({"ports": [{"name": "http", "containerPort": 80, "hostPort": 8080}]}),
            Some("spec.containers"),
            &[("", "pods")],
        );
        assert!(interacts(&host, &port));
        let account = fp(
            json!({"spec": {"template": {"spec": {"serviceAccountName": "app"}}}}),
            None,
            &[("apps", "deployments")],
        );
        let alias = fp(
            json!({"spec": {"template": {"spec": {"serviceAccount": "other"}}}}),
            None,
            &[("apps", "deployments")],
        );
        assert!(interacts(&account, &alias));
    }
}
