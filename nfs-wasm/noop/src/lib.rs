//! The empty NF: forwards every packet untouched and does nothing else. It
//! measures what calling an NF costs (the benchmarks' "empty NF") and is a
//! template for new NFs.

use sluice_sdk::{Batch, NetworkFunction, NfInfo};

/// The empty NF.
#[derive(Debug)]
pub struct Noop;

impl NetworkFunction for Noop {
    fn init(_config: &[u8]) -> Result<(Self, NfInfo), String> {
        Ok((Noop, NfInfo::stateless()))
    }

    fn process(&mut self, _batch: &mut Batch) -> Result<(), String> {
        Ok(())
    }
}

sluice_sdk::export_nf!(Noop);
