//! Output: every command builds one serializable report and prints it as a table (kubectl
//! style), a wide table, JSON or YAML.

use std::fmt::Write as _;

use clap::ValueEnum;
use serde::Serialize;

/// `-o`/`--output`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Aligned columns.
    #[default]
    Table,
    /// Aligned columns with more of them.
    Wide,
    /// JSON.
    Json,
    /// YAML.
    Yaml,
}

/// A command's result: serializable, and printable for people.
pub trait Report: Serialize {
    /// The human-readable form (`wide` asks for more columns).
    fn human(&self, wide: bool) -> String;
}

/// Prints `report` to stdout in `format`.
/// A reader that went away (`meshctl … | head`) ends the output quietly.
pub fn print<R: Report>(report: &R, format: Format) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut text = render(report, format)?;
    if !text.ends_with('\n') && !text.is_empty() {
        text.push('\n');
    }
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// The text `print` writes.
pub fn render<R: Report>(report: &R, format: Format) -> anyhow::Result<String> {
    Ok(match format {
        Format::Table => report.human(false),
        Format::Wide => report.human(true),
        Format::Json => {
            let mut s = serde_json::to_string_pretty(report)?;
            s.push('\n');
            s
        }
        Format::Yaml => serde_saphyr::to_string(report)?,
    })
}

/// Columns aligned as kubectl aligns them: upper-case headers, three spaces between columns.
#[derive(Clone, Debug, Default)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers.
    pub fn new<I, S>(headers: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Table {
            headers: headers.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row (cells beyond the headers are dropped, missing ones are blank).
    pub fn row<I, S>(&mut self, cells: I)
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut row: Vec<String> = cells.into_iter().map(Into::into).collect();
        row.resize(self.headers.len(), String::new());
        self.rows.push(row);
    }

    /// Whether the table has no rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The aligned text, one line per row, after the header line.
    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        let mut line = |cells: &[String]| {
            let mut l = String::new();
            for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
                if i + 1 == cells.len() {
                    l.push_str(cell);
                } else {
                    let _ = write!(l, "{cell:<w$}   ");
                }
            }
            out.push_str(l.trim_end());
            out.push('\n');
        };
        let headers: Vec<String> = self.headers.iter().map(|h| h.to_uppercase()).collect();
        line(&headers);
        for row in &self.rows {
            line(row);
        }
        out
    }
}

/// `s`, or `-` when empty.
pub fn or_dash(s: impl AsRef<str>) -> String {
    let s = s.as_ref();
    if s.is_empty() {
        "-".to_string()
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_on_the_widest_cell() {
        let mut t = Table::new(["name", "revision"]);
        t.row(["a", "blue-v1"]);
        t.row(["longer-name", "x"]);
        assert_eq!(
            t.render(),
            "NAME          REVISION\na             blue-v1\nlonger-name   x\n"
        );
    }

    #[test]
    fn missing_cells_are_blank_and_extra_ones_dropped() {
        let mut t = Table::new(["a", "b"]);
        t.row(["1"]);
        t.row(["1", "2", "3"]);
        assert_eq!(t.render(), "A   B\n1\n1   2\n");
    }
}
