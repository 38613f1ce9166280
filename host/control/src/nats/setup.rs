//! The cluster's JetStream stream and buckets: made by the gateway, awaited
//! by hosts.

use super::NatsBus;
use super::*;

impl NatsBus {
    /// Waits (up to a minute) for the buckets the gateway creates.
    pub(super) async fn await_buckets(&self) -> Result<(), BusError> {
        let n = &self.names;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let kv = self.js.get_key_value(n.desired_bucket()).await;
            let obj = self.js.get_object_store(n.module_bucket()).await;
            match (kv, obj) {
                (Ok(_), Ok(_)) => return Ok(()),
                (kv, obj) => {
                    let why = kv.err().map(|e| e.to_string()).or(obj.err().map(|e| e.to_string())).unwrap_or_default();
                    if tokio::time::Instant::now() > deadline {
                        return Err(self.conn(format!(
                            "the cluster's buckets ({}, {}) are not there: {why}; start the gateway first, and check this host's NATS permissions",
                            n.desired_bucket(),
                            n.module_bucket()
                        )));
                    }
                    tracing::info!("waiting for the gateway to create the cluster's buckets: {why}");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }

    /// Creates the stream and buckets if missing, with `configured`
    /// replicas, or else as many as the cluster has servers (at most 3).
    /// Existing ones are set to `configured`, or else scaled up (never
    /// down: a server that is away for a moment must not cost a copy).
    pub(super) async fn ensure(&self, configured: Option<usize>) -> Result<(), BusError> {
        let replicas = configured.unwrap_or_else(|| self.cluster_size().clamp(1, 3));
        let n = &self.names;
        self.js
            .get_or_create_stream(stream::Config {
                name: n.meter_stream(),
                description: Some("Sluice meter records".into()),
                subjects: vec![n.meters()],
                storage: stream::StorageType::File,
                duplicate_window: DUPLICATE_WINDOW,
                max_age: METER_RETENTION,
                num_replicas: replicas,
                ..Default::default()
            })
            .await
            .map_err(|e| self.conn(format!("creating stream {}: {e}", n.meter_stream())))?;
        if self.js.get_key_value(n.desired_bucket()).await.is_err() {
            self.js
                .create_key_value(kv::Config {
                    bucket: n.desired_bucket(),
                    description: "Sluice desired deployments per host group".into(),
                    history: 1,
                    storage: stream::StorageType::File,
                    num_replicas: replicas,
                    ..Default::default()
                })
                .await
                .map_err(|e| self.conn(format!("creating KV bucket {}: {e}", n.desired_bucket())))?;
        }
        if self.js.get_key_value(n.groups_bucket()).await.is_err() {
            self.js
                .create_key_value(kv::Config {
                    bucket: n.groups_bucket(),
                    description: "Sluice flow-ownership table per host group".into(),
                    history: 1,
                    storage: stream::StorageType::File,
                    // (async-nats makes KV streams allow direct gets, which
                    // is how hosts read their group's key.)
                    num_replicas: replicas,
                    ..Default::default()
                })
                .await
                .map_err(|e| self.conn(format!("creating KV bucket {}: {e}", n.groups_bucket())))?;
        }
        if self.js.get_object_store(n.module_bucket()).await.is_err() {
            self.js
                .create_object_store(object_store::Config {
                    bucket: n.module_bucket(),
                    description: Some("Sluice NF modules by SHA-256".into()),
                    storage: stream::StorageType::File,
                    num_replicas: replicas,
                    ..Default::default()
                })
                .await
                .map_err(|e| self.conn(format!("creating object store {}: {e}", n.module_bucket())))?;
        }
        // Streams made earlier with another replica count are scaled.
        for name in [
            n.meter_stream(),
            format!("KV_{}", n.desired_bucket()),
            format!("KV_{}", n.groups_bucket()),
            format!("OBJ_{}", n.module_bucket()),
        ] {
            let mut s =
                self.js.get_stream(&name).await.map_err(|e| self.conn(format!("opening stream {name}: {e}")))?;
            let info = s.info().await.map_err(|e| self.conn(format!("stream {name}: {e}")))?;
            let wanted = match configured {
                Some(_) => info.config.num_replicas != replicas,
                None => info.config.num_replicas < replicas,
            };
            if wanted {
                let mut config = info.config.clone();
                config.num_replicas = replicas;
                self.js
                    .update_stream(config)
                    .await
                    .map_err(|e| self.conn(format!("setting stream {name} to {replicas} replica(s): {e}")))?;
                tracing::info!(stream = %name, replicas, "stream replicas changed");
            }
        }
        Ok(())
    }
}
