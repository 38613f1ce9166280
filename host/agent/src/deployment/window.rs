//! A deployment's meter window in numbers: each NF's sums since the window
//! opened (what its meter records and checkpoints carry), and its work
//! added to the metrics when the window closes.

use super::Active;
use crate::journal::NfSums;
use sluice_telemetry::metrics;

impl Active {
    /// Adds the window's work of each NF to the metrics.
    pub(super) fn record_window_metrics(&mut self) {
        if !metrics::enabled() {
            return;
        }
        self.metric_attrs();
        let worker = self.lane.map(|l| opentelemetry::KeyValue::new("worker", l as i64));
        let stages = self.worker.chain().stages();
        for ((stage, base), attrs) in stages.iter().zip(&self.base).zip(&self.metric_attrs) {
            let d = stage.meters().since(base);
            metrics::nf().record_window(attrs, worker.as_ref(), &d, stage.state_bytes(), stage.state_entries());
        }
    }

    /// Each NF's sums since the window opened.
    pub(super) fn window_sums(&self) -> Vec<NfSums> {
        self.worker
            .chain()
            .stages()
            .iter()
            .zip(&self.base)
            .zip(&self.spec.nfs)
            .zip(&self.state_byte_us)
            .map(|(((stage, base), nf), byte_us)| {
                // The counters since the window opened, the state held now,
                // and the state's held-time the agent integrated.
                let mut sums = stage.meters().since(base);
                sums.state_byte_ms = u64::try_from(byte_us / 1000).unwrap_or(u64::MAX);
                NfSums {
                    nf: nf.name.clone(),
                    module: nf.module.name.clone(),
                    version: nf.module.version.clone(),
                    digest: nf.module.digest.clone(),
                    sums,
                }
            })
            .collect()
    }
}
