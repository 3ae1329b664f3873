//! Fixtures shared by the webhook server's integration tests.

use std::path::PathBuf;
use std::sync::Arc;

use meshplane_webhooks::inject::{CaptureMode, InjectionConfig};
use meshplane_webhooks::{StaticTenant, Webhooks};

/// Tenant blue's revision blue-v1 with the member namespace shop.
pub fn webhooks() -> Arc<Webhooks> {
    let injection = InjectionConfig {
        tenant: "blue".into(),
        revision: "blue-v1".into(),
        proxy_image: "proxy:test".into(),
        trust_domain: "cluster.local".into(),
        default_capture_mode: CaptureMode::Default,
    };
    Arc::new(Webhooks::new(
        injection,
        Arc::new(StaticTenant::new("blue", "meshplane-blue", ["shop"])),
    ))
}

/// An empty directory of this test process named after `name`.
pub fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("meshplane-webhooks-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}
