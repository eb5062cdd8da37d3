//! Generated Pods and `mutate` lists for the property test of the translation
//! (`mutation_translation`): drawn from a small vocabulary of Pod fields so that names collide
//! (merges find existing elements and keys) and every value has the type the Pod schema wants.

use serde_json::{Map, Value, json};

/// A deterministic generator (xorshift64*), so a seed names a corpus.
pub(crate) struct Generator {
    state: u64,
}

const LABEL_KEYS: [&str; 4] = ["team", "tier", "app", "env"];
const LABEL_VALUES: [&str; 3] = ["a", "b", "c"];
const CONTAINERS: [&str; 3] = ["app", "side", "proxy"];
const IMAGES: [&str; 3] = ["nginx", "registry.internal/x", "busybox"];
const ENV_NAMES: [&str; 3] = ["A", "B", "C"];
const ARGS: [&str; 3] = ["--x", "--y", "--z"];
const CAPABILITIES: [&str; 4] = ["BPF", "NET_RAW", "ALL", "NET_ADMIN"];
const VOLUMES: [&str; 2] = ["cache", "tmp"];
const GUARDS: [&str; 3] = [
    "element.name == 'app'",
    "!element.image.startsWith('registry.internal/')",
    "has(object.metadata.labels) && 'team' in object.metadata.labels",
];

impl Generator {
    pub(crate) fn new(seed: u64) -> Self {
        Generator {
            state: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
        }
    }

    fn next(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// True with probability `percent`%.
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[(self.next() % from.len() as u64) as usize]
    }

    /// Up to `max` distinct picks, at least `min`.
    fn some<'a>(&mut self, from: &[&'a str], min: usize, max: usize) -> Vec<&'a str> {
        let want = min + (self.next() % (max - min + 1) as u64) as usize;
        let mut picked: Vec<&str> = Vec::new();
        for _ in 0..want * 3 {
            if picked.len() == want {
                break;
            }
            let p = self.pick(from);
            if !picked.contains(&p) {
                picked.push(p);
            }
        }
        picked
    }

    fn labels(&mut self, nulls: bool) -> Value {
        let mut labels = Map::new();
        for key in self.some(&LABEL_KEYS, 1, 3) {
            let value = if nulls && self.chance(25) {
                Value::Null
            } else {
                json!(self.pick(&LABEL_VALUES))
            };
            labels.insert(key.to_string(), value);
        }
        Value::Object(labels)
    }

    /// Fields of a container other than its name.
    fn container_fields(&mut self, with_image: bool) -> Map<String, Value> {
        let mut c = Map::new();
        if with_image || self.chance(30) {
            c.insert("image".into(), json!(self.pick(&IMAGES)));
        }
        if self.chance(35) {
            c.insert("args".into(), json!(self.some(&ARGS, 1, 3)));
        }
        if self.chance(40) {
            let env: Vec<Value> = self
                .some(&ENV_NAMES, 1, 2)
                .into_iter()
                .map(|name| json!({"name": name, "value": self.pick(&["1", "2"])}))
                .collect();
            c.insert("env".into(), Value::Array(env));
        }
        if self.chance(45) {
            let mut security = Map::new();
            if self.chance(70) {
                let mut capabilities = Map::new();
                for key in ["drop", "add"] {
                    if self.chance(60) {
                        capabilities.insert(key.into(), json!(self.some(&CAPABILITIES, 1, 2)));
                    }
                }
                security.insert("capabilities".into(), Value::Object(capabilities));
            }
            if self.chance(30) {
                let user = if self.chance(50) { 1000 } else { 65532 };
                security.insert("runAsUser".into(), json!(user));
            }
            if self.chance(30) {
                security.insert("readOnlyRootFilesystem".into(), json!(self.chance(50)));
            }
            c.insert("securityContext".into(), Value::Object(security));
        }
        if self.chance(25) {
            c.insert(
                "resources".into(),
                json!({"limits": {"memory": self.pick(&["64Mi", "128Mi"])}}),
            );
        }
        if self.chance(20) {
            c.insert(
                "imagePullPolicy".into(),
                json!(self.pick(&["Always", "IfNotPresent"])),
            );
        }
        c
    }

    fn containers(&mut self, min: usize, with_image: bool) -> Value {
        let containers: Vec<Value> = self
            .some(&CONTAINERS, min, 2)
            .into_iter()
            .map(|name| {
                let mut c = self.container_fields(with_image);
                c.insert("name".into(), json!(name));
                Value::Object(c)
            })
            .collect();
        Value::Array(containers)
    }

    fn volumes(&mut self) -> Value {
        let volumes: Vec<Value> = self
            .some(&VOLUMES, 1, 2)
            .into_iter()
            .map(|name| {
                let dir = if self.chance(50) {
                    json!({})
                } else {
                    json!({"medium": "Memory"})
                };
                json!({"name": name, "emptyDir": dir})
            })
            .collect();
        Value::Array(volumes)
    }

    /// A Pod whose dry-run create is deterministic.
    pub(crate) fn pod(&mut self) -> Value {
        let mut spec = Map::new();
        spec.insert("automountServiceAccountToken".into(), json!(false));
        spec.insert("containers".into(), self.containers(1, true));
        if self.chance(30) {
            spec.insert("volumes".into(), self.volumes());
        }
        if self.chance(30) {
            spec.insert("securityContext".into(), json!({"runAsUser": 1000}));
        }
        let mut metadata = Map::new();
        metadata.insert("name".into(), json!("p"));
        if self.chance(60) {
            metadata.insert("labels".into(), self.labels(false));
        }
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
    }

    /// One `mutate[]` entry: a merge at the root or a `forEach` over the containers, with or
    /// without a guard and `overwrite`.
    fn mutation(&mut self) -> Value {
        let overwrite = self.chance(25);
        let mut m = Map::new();
        if self.chance(40) {
            m.insert("forEach".into(), json!("spec.containers"));
            let fields = self.container_fields(false);
            let merge = if fields.is_empty() {
                json!({"imagePullPolicy": "IfNotPresent"})
            } else {
                Value::Object(fields)
            };
            m.insert("merge".into(), merge);
        } else {
            let mut merge = Map::new();
            if self.chance(50) {
                merge.insert("metadata".into(), json!({"labels": self.labels(overwrite)}));
            }
            let mut spec = Map::new();
            if self.chance(50) {
                spec.insert("containers".into(), self.containers(1, true));
            }
            if self.chance(25) {
                spec.insert("volumes".into(), self.volumes());
            }
            if self.chance(20) {
                spec.insert(
                    "securityContext".into(),
                    json!({"runAsUser": 65532, "runAsNonRoot": true}),
                );
            }
            if !spec.is_empty() || merge.is_empty() {
                if spec.is_empty() {
                    spec.insert("containers".into(), self.containers(1, true));
                }
                merge.insert("spec".into(), Value::Object(spec));
            }
            m.insert("merge".into(), Value::Object(merge));
        }
        if self.chance(25) {
            let guard = self.pick(&GUARDS);
            let guard = if m.contains_key("forEach") || !guard.contains("element") {
                guard
            } else {
                GUARDS[2]
            };
            m.insert("when".into(), json!(guard));
        }
        if overwrite {
            m.insert("overwrite".into(), json!(true));
        }
        Value::Object(m)
    }

    /// A `mutate` list of one to three entries.
    pub(crate) fn mutate_list(&mut self) -> Value {
        let length = 1 + (self.next() % 3) as usize;
        Value::Array((0..length).map(|_| self.mutation()).collect())
    }
}
