//! Access logging (`meshConfig.accessLogging`): a file access log on every HTTP connection
//! manager and TCP proxy of the proxy.

use envoy_types::pb::envoy::config::accesslog::v3::access_log::ConfigType as AccessLogConfigType;
use envoy_types::pb::envoy::config::accesslog::v3::AccessLog;
use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType;
use envoy_types::pb::envoy::config::listener::v3::Filter;
use envoy_types::pb::envoy::extensions::access_loggers::file::v3::FileAccessLog;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use envoy_types::util::pack_any;
use meshplane_crds::controlplane::AccessLogging;
use prost::Message;

use super::envoy::filter_name::{HTTP_CONNECTION_MANAGER, TCP_PROXY};
use super::Translated;

/// Where access logs go unless `accessLogging.path` says otherwise.
pub const DEFAULT_PATH: &str = "/dev/stdout";

fn file_log(path: &str) -> AccessLog {
    AccessLog {
        name: "envoy.access_loggers.file".to_string(),
        config_type: Some(AccessLogConfigType::TypedConfig(pack_any(FileAccessLog {
            path: path.to_string(),
            ..Default::default()
        }))),
        ..Default::default()
    }
}

fn add_to_filter(f: &mut Filter, log: &AccessLog) {
    let Some(ConfigType::TypedConfig(any)) = &mut f.config_type else {
        return;
    };
    if f.name == HTTP_CONNECTION_MANAGER {
        if let Ok(mut hcm) = HttpConnectionManager::decode(any.value.as_slice()) {
            hcm.access_log.push(log.clone());
            any.value = hcm.encode_to_vec();
        }
    } else if f.name == TCP_PROXY {
        if let Ok(mut tcp) = TcpProxy::decode(any.value.as_slice()) {
            tcp.access_log.push(log.clone());
            any.value = tcp.encode_to_vec();
        }
    }
}

/// Adds a file access log to every HTTP connection manager and TCP proxy, when enabled.
pub fn apply(settings: &AccessLogging, out: &mut Translated) {
    if !settings.enabled {
        return;
    }
    let log = file_log(settings.path.as_deref().unwrap_or(DEFAULT_PATH));
    for l in &mut out.listeners {
        for chain in &mut l.filter_chains {
            for f in &mut chain.filters {
                add_to_filter(f, &log);
            }
        }
    }
}
