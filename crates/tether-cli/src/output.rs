//! Output of listing commands: a table for people (coloured header only on a terminal), or the
//! same rows as YAML or JSON for scripts.

use comfy_table::presets::NOTHING;
use comfy_table::{Attribute, Cell, Table};
use serde::Serialize;

/// `-o table|yaml|json`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Format {
    /// Aligned columns.
    #[default]
    Table,
    /// YAML.
    Yaml,
    /// JSON.
    Json,
}

/// Renders `rows` (each a list of cells under `headers`) or, for YAML/JSON, `data`.
pub fn render<T: Serialize>(
    format: Format,
    headers: &[&str],
    rows: Vec<Vec<String>>,
    data: &T,
) -> anyhow::Result<String> {
    Ok(match format {
        Format::Json => serde_json::to_string_pretty(data)? + "\n",
        Format::Yaml => serde_norway::to_string(data)?,
        Format::Table => {
            let mut table = Table::new();
            table.load_style(NOTHING);
            let colour = crate::colour();
            table.set_header(headers.iter().map(|h| {
                let cell = Cell::new(h);
                if colour {
                    cell.add_attribute(Attribute::Bold)
                } else {
                    cell
                }
            }));
            for row in rows {
                table.add_row(row);
            }
            // kubectl's look: no left padding, three spaces between columns.
            for column in table.column_iter_mut() {
                column.set_padding((0, 3));
            }
            format!("{}\n", table.trim_fmt())
        }
    })
}

/// A short age like kubectl's: `45s`, `12m`, `3h`, `5d`.
pub fn age(seconds: i64) -> String {
    match seconds.max(0) {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_and_machines_get_data() {
        let rows = vec![
            vec!["east".to_string(), "True".to_string()],
            vec!["west-long".into(), "Unknown".into()],
        ];
        let out = render(Format::Table, &["NAME", "READY"], rows.clone(), &rows).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert!(
            lines[0].starts_with("NAME") && lines[0].contains("READY"),
            "{out}"
        );
        assert_eq!(
            lines[1].find("True"),
            lines[2].find("Unknown"),
            "columns align:\n{out}"
        );
        let json = render(Format::Json, &[], vec![], &rows).unwrap();
        assert!(json.contains("\"west-long\""));
        assert_eq!(age(59), "59s");
        assert_eq!(age(3600), "60m");
        assert_eq!(age(90_000), "25h");
    }
}
