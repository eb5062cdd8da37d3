//! The manager's writes of its Secret, and the versions of it this replica has seen.
use super::*;

impl TlsManager {
    /// Creates the missing Secret holding `material`: the Secret now stored, or `None` to read
    /// it again (another replica created it first: its CA is adopted).
    pub(super) async fn create_secret(
        &mut self,
        material: &TlsMaterial,
        restored: bool,
    ) -> Result<Option<Option<Secret>>, TlsError> {
        let name = self.config.secret_name.clone();
        if restored {
            warn!(
                secret = %name,
                "TLS Secret missing; recreating it from the material this replica serves"
            );
        }
        match self
            .api
            .create(&PostParams::default(), &self.new_secret(material))
            .await
        {
            Ok(created) => {
                info!(secret = %name, "created TLS Secret");
                self.remember_version(created.metadata.resource_version.clone());
                Ok(Some(Some(created)))
            }
            Err(kube::Error::Api(status)) if status.is_already_exists() => {
                info!(secret = %name, "TLS Secret created concurrently; adopting it");
                Ok(None)
            }
            Err(source) => Err(TlsError::CreateSecret { name, source }),
        }
    }

    /// Replaces the Secret's material with `material`: the Secret now stored (`Some(None)`:
    /// deleted meanwhile), or `None` to read it again (changed meanwhile).
    pub(super) async fn replace_secret(
        &mut self,
        mut secret: Secret,
        material: &TlsMaterial,
        action: Action,
        restored: bool,
    ) -> Result<Option<Option<Secret>>, TlsError> {
        let name = self.config.secret_name.clone();
        if restored {
            warn!(secret = %name, %action, "TLS Secret unusable; restoring the material this replica serves");
        }
        let data = secret.data.get_or_insert_with(BTreeMap::new);
        for key in MANAGED_KEYS {
            data.remove(key);
        }
        data.extend(material.to_secret_data());
        // `replace` sends the resourceVersion we read: a concurrent writer makes it fail with 409
        // instead of being overwritten.
        match self
            .api
            .replace(&name, &PostParams::default(), &secret)
            .await
        {
            Ok(replaced) => {
                info!(secret = %name, %action, "TLS Secret updated");
                self.remember_version(replaced.metadata.resource_version.clone());
                Ok(Some(Some(replaced)))
            }
            Err(kube::Error::Api(status)) if status.is_conflict() => {
                debug!(secret = %name, %action, "TLS Secret changed concurrently; re-planning");
                Ok(None)
            }
            Err(kube::Error::Api(status)) if status.is_not_found() => {
                debug!(secret = %name, "TLS Secret deleted concurrently; re-creating");
                Ok(Some(None))
            }
            Err(source) => Err(TlsError::UpdateSecret { name, source }),
        }
    }

    pub(super) fn new_secret(&self, material: &TlsMaterial) -> Secret {
        let labels = BTreeMap::from([
            (
                "app.kubernetes.io/name".to_string(),
                "gatehouse".to_string(),
            ),
            (
                "app.kubernetes.io/component".to_string(),
                "webhook-tls".to_string(),
            ),
            (
                "app.kubernetes.io/managed-by".to_string(),
                "gatehouse".to_string(),
            ),
        ]);
        Secret {
            metadata: ObjectMeta {
                name: Some(self.config.secret_name.clone()),
                namespace: Some(self.config.namespace.clone()),
                labels: Some(labels),
                ..ObjectMeta::default()
            },
            type_: Some("kubernetes.io/tls".to_string()),
            data: Some(material.to_secret_data()),
            ..Secret::default()
        }
    }

    pub(super) fn secret_ref(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Secret".into()),
            name: Some(self.config.secret_name.clone()),
            namespace: Some(self.config.namespace.clone()),
            ..ObjectReference::default()
        }
    }

    /// Whether the watch brings a version of the Secret this replica has already moved past.
    /// Versions are only compared for equality (they are opaque): the watch delivers them in
    /// order, so one we remember, other than the newest, is behind us.
    pub(super) fn is_stale(&mut self, secret: &Secret) -> bool {
        let Some(version) = secret.metadata.resource_version.as_ref() else {
            return false;
        };
        match self.versions.iter().position(|v| v == version) {
            Some(i) if i + 1 < self.versions.len() => {
                // Everything up to it has been delivered now: forget it.
                self.versions.drain(..=i);
                true
            }
            Some(_) => true,
            None => {
                self.remember_version(Some(version.clone()));
                false
            }
        }
    }

    pub(super) fn remember_version(&mut self, version: Option<String>) {
        let Some(version) = version else { return };
        if self.versions.back() != Some(&version) {
            self.versions.push_back(version);
        }
        while self.versions.len() > 32 {
            self.versions.pop_front();
        }
    }
}
