//! The engine contract (`corral_testing::contract`) against the real
//! Docker daemon: the same cases the Kubernetes backend runs, over the
//! hardened default spec and the offline busybox image
//! (`common::ContractTarget`, shared with `contract_gvisor.rs`).

mod common;

use corral::Isolation;
use corral_testing::contract::Target;

async fn docker(_case: &str) -> Option<Box<dyn Target>> {
    Some(Box::new(common::ContractTarget {
        runtime: common::backend().await,
        isolation: Isolation::Container,
    }))
}

corral_testing::contract_suite!(docker);
