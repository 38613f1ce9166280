//! Plain data shared by the store, the group controller and the API: a
//! group's scaling settings and a host as last heard from.

use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use sluice_control::Heartbeat;
use sluice_group::MAX_MEMBERS;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use utoipa::ToSchema;

/// The operator's scaling settings of a group.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GroupSettings {
    /// Fewest active hosts (when that many are up and not drained).
    #[serde(deserialize_with = "crate::whole::required")]
    #[schema(minimum = 1, maximum = 254)]
    pub min_hosts: u32,
    /// Most active hosts, at least `min_hosts` (none: no limit).
    #[serde(default, deserialize_with = "crate::whole::optional")]
    #[schema(minimum = 1, maximum = 254)]
    pub max_hosts: Option<u32>,
    /// Load to run the active hosts at, as a share of their declared
    /// capacity (0.05-1). None: no autoscaling, every host is active.
    #[schema(minimum = 0.05, maximum = 1)]
    pub target_load: Option<f64>,
}

impl Default for GroupSettings {
    fn default() -> Self {
        GroupSettings { min_hosts: 1, max_hosts: None, target_load: None }
    }
}

impl GroupSettings {
    /// Checks the bounds.
    pub fn check(&self) -> Result<(), String> {
        let most = MAX_MEMBERS as u32;
        if !(1..=most).contains(&self.min_hosts) {
            return Err(format!("min_hosts {} must be 1 to {most}", self.min_hosts));
        }
        if let Some(max) = self.max_hosts
            && !(self.min_hosts..=most).contains(&max)
        {
            return Err(format!("max_hosts {max} must be from min_hosts ({}) to {most}", self.min_hosts));
        }
        if let Some(t) = self.target_load
            && !(0.05..=1.0).contains(&t)
        {
            return Err(format!("target_load {t} must be a share of capacity from 0.05 to 1"));
        }
        Ok(())
    }
}

/// A host as last heard from.
#[derive(Debug, Clone)]
pub struct HostSeen {
    /// Its last heartbeat.
    pub heartbeat: Heartbeat,
    /// When it arrived.
    pub at: Instant,
}

impl HostSeen {
    /// Whether the host is considered up: heard from within `silence`.
    pub fn alive(&self, silence: Duration) -> bool {
        self.at.elapsed() < silence
    }
}

/// The hosts heard from, by id: written as heartbeats arrive, read by the
/// API and the group controller.
pub type SeenHosts = Arc<RwLock<HashMap<String, HostSeen>>>;
