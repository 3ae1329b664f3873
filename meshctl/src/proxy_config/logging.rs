//! `proxy-config log`: a proxy's logger levels (the admin's `POST /logging`), and changing them:
//! `--level debug` sets every logger, `--level http:debug,upstream:trace` the named ones (Envoy's
//! `paths` form), `--reset` puts every logger back to `warning` (what istioctl resets to).

use serde::Serialize;

use crate::output::{Report, Table};

/// Envoy's log levels.
pub const LEVELS: [&str; 7] = [
    "trace", "debug", "info", "warning", "error", "critical", "off",
];

/// The level `--reset` sets.
pub const RESET_LEVEL: &str = "warning";

/// The admin path that changes levels as `level` asks, or an error naming what is wrong.
pub fn change_path(level: &str) -> anyhow::Result<String> {
    let level = level.trim();
    if !level.contains(':') {
        check(level)?;
        return Ok(format!("/logging?level={level}"));
    }
    let mut paths = Vec::new();
    for part in level.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (logger, lvl) = part.split_once(':').ok_or_else(|| {
            anyhow::anyhow!("{part:?}: give either one level or logger:level pairs")
        })?;
        if logger.is_empty()
            || !logger
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            anyhow::bail!("{logger:?} is not a logger name");
        }
        check(lvl)?;
        paths.push(format!("{logger}:{lvl}"));
    }
    Ok(format!("/logging?paths={}", paths.join(",")))
}

fn check(level: &str) -> anyhow::Result<()> {
    if LEVELS.contains(&level) {
        Ok(())
    } else {
        anyhow::bail!(
            "{level:?} is not a log level (one of {})",
            LEVELS.join(", ")
        )
    }
}

/// One logger and its level.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Logger {
    pub name: String,
    pub level: String,
}

/// The loggers of a proxy.
#[derive(Clone, Debug, Serialize)]
pub struct Loggers {
    pub pod: String,
    pub loggers: Vec<Logger>,
}

/// Reads the admin's listing (`active loggers:` then `  <name>: <level>` lines).
pub fn parse(text: &str) -> Vec<Logger> {
    text.lines()
        .filter_map(|line| {
            let (name, level) = line.trim().split_once(':')?;
            let level = level.trim();
            (!name.contains(' ') && LEVELS.contains(&level)).then(|| Logger {
                name: name.to_string(),
                level: level.to_string(),
            })
        })
        .collect()
}

impl Report for Loggers {
    fn human(&self, _wide: bool) -> String {
        let mut table = Table::new(["LOGGER", "LEVEL"]);
        for l in &self.loggers {
            table.row([l.name.as_str(), l.level.as_str()]);
        }
        format!("{}:\n{}", self.pod, table.render())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_become_admin_paths_and_bad_ones_are_refused() {
        assert_eq!(change_path("debug").expect("valid"), "/logging?level=debug");
        assert_eq!(
            change_path("http:debug, upstream:trace").expect("valid"),
            "/logging?paths=http:debug,upstream:trace"
        );
        assert!(change_path("loud").is_err());
        assert!(change_path("http:loud").is_err());
        assert!(change_path("a&b:debug").is_err());
    }

    #[test]
    fn the_admin_listing_is_read_line_by_line() {
        let text = "active loggers:\n  admin: info\n  http: debug\n  upstream: warning\n";
        let loggers = parse(text);
        assert_eq!(loggers.len(), 3);
        assert_eq!(
            loggers[1],
            Logger {
                name: "http".into(),
                level: "debug".into()
            }
        );
    }
}
