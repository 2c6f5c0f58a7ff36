//! The `admission` target: arbitrary Service records and configurations through
//! `validate-config` and `admit-service`, natively. Never a panic; the same input twice gives
//! the same verdict and warnings (they are pure functions of their arguments, docs/design.md
//! §2.1); never more warnings than the WIT allows.

use crate::input::Dec;
use clb_sandbox::native::{config_to_model, service_to_model};

pub fn admission(data: &[u8]) {
    let mut d = Dec::new(data);
    let config = config_to_model(&d.config());
    let first = clb_guest::validate_config(&config);
    assert_eq!(first, clb_guest::validate_config(&config), "validate-config is a function of its input");
    for _ in 0..d.len(4) {
        let service = service_to_model(&d.service());
        let verdict = clb_guest::admit_service(&config, &service);
        assert_eq!(verdict, clb_guest::admit_service(&config, &service), "admit-service is a function of its input");
        let warnings = clb_guest::admission::warnings(&config, &service);
        assert_eq!(warnings, clb_guest::admission::warnings(&config, &service), "warnings are a function of the input");
        assert!(warnings.len() <= clb_guest::admission::MAX_WARNINGS, "{} warnings", warnings.len());
    }
}
