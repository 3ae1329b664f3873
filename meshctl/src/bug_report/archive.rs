//! The report as files in memory, written once as a gzip-compressed tar archive under one
//! top-level directory (what `tar xzf` unpacks).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;

use anyhow::Context as _;

/// Files by their path inside the report.
#[derive(Debug, Default)]
pub struct Archive {
    files: BTreeMap<String, Vec<u8>>,
}

impl Archive {
    /// Adds (or replaces) one file.
    pub fn add(&mut self, path: impl Into<String>, content: impl Into<Vec<u8>>) {
        self.files.insert(path.into(), content.into());
    }

    /// The paths, in order.
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.files.keys().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// Writes `<root>/<path>` for every file into a `.tar.gz` at `out`.
    pub fn write_tar_gz(&self, root: &str, out: &Path) -> anyhow::Result<()> {
        let file =
            std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
        let gz = flate2::write::GzEncoder::new(file, flate2::Compression::default());
        let mut tar = tar::Builder::new(gz);
        let mtime = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        for (path, content) in &self.files {
            let mut header = tar::Header::new_gnu();
            header.set_size(content.len() as u64);
            header.set_mode(0o644);
            header.set_mtime(mtime);
            tar.append_data(&mut header, format!("{root}/{path}"), content.as_slice())
                .with_context(|| format!("adding {path}"))?;
        }
        let mut gz = tar.into_inner().context("finishing the archive")?;
        gz.flush().context("writing the archive")?;
        gz.finish().context("finishing the compression")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;

    #[test]
    fn files_come_back_from_the_archive_under_its_root() {
        let mut archive = Archive::default();
        archive.add("version.json", "{}");
        archive.add("logs/meshplane-system/operator-1/operator.log", "started\n");
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("report.tar.gz");
        archive.write_tar_gz("report", &out).expect("written");
        let mut read = tar::Archive::new(flate2::read::GzDecoder::new(
            std::fs::File::open(&out).expect("open"),
        ));
        let mut found = Vec::new();
        for entry in read.entries().expect("entries") {
            let mut entry = entry.expect("entry");
            let path = entry.path().expect("path").display().to_string();
            let mut text = String::new();
            entry.read_to_string(&mut text).expect("text");
            found.push((path, text));
        }
        assert_eq!(
            found,
            [
                (
                    "report/logs/meshplane-system/operator-1/operator.log".to_string(),
                    "started\n".to_string()
                ),
                ("report/version.json".to_string(), "{}".to_string()),
            ]
        );
    }
}
