//! Every Policy in config/samples is valid as the engine (and so Gatehouse's own admission
//! check) judges it, and the chart ships the same samples.
use std::path::Path;

use gatehouse_api::v1alpha1::{NamespacedPolicy, Policy};
use serde_json::Value;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
}

#[test]
fn every_sample_policy_is_valid_and_in_the_chart() {
    let dir = root().join("config/samples");
    let mut policies = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        // tests/ holds the samples' own tests (`gatehouse test config/samples`), not samples.
        if path.file_name().unwrap() == "kustomization.yaml" || path.is_dir() {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let in_chart = root()
            .join("charts/gatehouse/files/samples")
            .join(path.file_name().unwrap());
        assert_eq!(
            std::fs::read(&in_chart).ok(),
            Some(bytes.clone()),
            "{in_chart:?}"
        );
        for doc in serde_saphyr::from_slice_multiple::<Value>(&bytes).unwrap() {
            let problems = match doc["kind"].as_str() {
                Some("Policy") => {
                    gatehouse_engine::validate(&serde_json::from_value::<Policy>(doc).unwrap())
                }
                Some("NamespacedPolicy") => {
                    let mut np: NamespacedPolicy = serde_json::from_value(doc).unwrap();
                    // Where kubectl would apply it without -n.
                    np.metadata.namespace = Some("default".into());
                    gatehouse_engine::policy::validate_namespaced(&np)
                }
                _ => continue,
            };
            assert!(problems.is_empty(), "{path:?}: {problems:?}");
            policies += 1;
        }
    }
    assert!(policies >= 6, "{policies} sample Policies");
}
