//! MXNet's aggregate statistics (`profiler.dumps()`): per domain, per name, how many times and
//! how long; per device, the storage in use. Printed as MXNet's table or as its JSON document.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;

use super::{Record, CUSTOM_OPERATOR};
use crate::error::Result;

/// The domain of memory statistics (MXNet's name).
const DEVICE_STORAGE: &str = "Device Storage";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReportFormat {
    Table,
    Json,
}

impl ReportFormat {
    pub fn from_name(name: &str) -> Result<ReportFormat> {
        match name {
            "table" => Ok(ReportFormat::Table),
            "json" => Ok(ReportFormat::Json),
            _ => crate::bail!(Value, "profiler.dumps: format must be 'table' or 'json', got '{name}'"),
        }
    }
}

/// The statistic entries are ordered by within each domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortBy {
    Total,
    Avg,
    Min,
    Max,
    Count,
}

impl SortBy {
    pub fn from_name(name: &str) -> Result<SortBy> {
        match name {
            "total" => Ok(SortBy::Total),
            "avg" => Ok(SortBy::Avg),
            "min" => Ok(SortBy::Min),
            "max" => Ok(SortBy::Max),
            "count" => Ok(SortBy::Count),
            _ => crate::bail!(Value, "profiler.dumps: sort_by must be 'total', 'avg', 'min', 'max' or 'count', got '{name}'"),
        }
    }
}

/// What a statistic measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Measure {
    /// Durations in nanoseconds, reported in milliseconds.
    Duration,
    /// A counter's values, reported as they are.
    Value,
    /// Bytes in use, reported in kilobytes (1000 bytes, as MXNet).
    Bytes,
}

#[derive(Clone, Debug)]
struct Stat {
    measure: Measure,
    count: u64,
    sum: f64,
    min: f64,
    max: f64,
    last: f64,
}

impl Stat {
    fn new(measure: Measure) -> Stat {
        Stat { measure, count: 0, sum: 0.0, min: f64::INFINITY, max: f64::NEG_INFINITY, last: 0.0 }
    }

    fn add(&mut self, value: f64) {
        self.count += 1;
        self.sum += value;
        self.min = self.min.min(value);
        self.max = self.max.max(value);
        self.last = value;
    }

    /// The value in the unit it is reported in.
    fn scaled(&self, raw: f64) -> f64 {
        match self.measure {
            Measure::Duration => raw / 1e6,
            Measure::Value => raw,
            Measure::Bytes => raw / 1e3,
        }
    }

    /// The "Total" column: the summed time of a duration; a counter's (or a memory gauge's)
    /// total is its latest value, since its values are levels, not amounts.
    fn total(&self) -> f64 {
        self.scaled(if self.measure == Measure::Duration { self.sum } else { self.last })
    }
    fn avg(&self) -> f64 {
        self.scaled(if self.count == 0 { 0.0 } else { self.sum / self.count as f64 })
    }
    fn min(&self) -> f64 {
        self.scaled(if self.count == 0 { 0.0 } else { self.min })
    }
    fn max(&self) -> f64 {
        self.scaled(if self.count == 0 { 0.0 } else { self.max })
    }

    fn key(&self, sort_by: SortBy) -> f64 {
        match sort_by {
            SortBy::Total => self.total(),
            SortBy::Avg => self.avg(),
            SortBy::Min => self.min(),
            SortBy::Max => self.max(),
            SortBy::Count => self.count as f64,
        }
    }
}

/// Statistics by domain (ordered by name, as MXNet prints them) and by entry name.
#[derive(Default)]
pub(crate) struct Aggregate {
    domains: BTreeMap<String, HashMap<String, Stat>>,
}

impl Aggregate {
    fn stat(&mut self, domain: &str, name: &str, measure: Measure) -> &mut Stat {
        let entries = self.domains.entry(domain.to_string()).or_default();
        if !entries.contains_key(name) {
            entries.insert(name.to_string(), Stat::new(measure));
        }
        entries.get_mut(name).expect("inserted above")
    }

    pub fn add(&mut self, record: &Record) {
        match record {
            Record::Op(op) => {
                let elapsed = op.end.saturating_sub(op.start) as f64;
                let name = op.op.name();
                match &op.custom {
                    Some(custom) => self.stat(CUSTOM_OPERATOR, &format!("{custom}::{name}"), Measure::Duration).add(elapsed),
                    None => self.stat("operator", &name, Measure::Duration).add(elapsed),
                }
            }
            Record::Span { category, name, start, end, .. } => {
                self.stat(category, name, Measure::Duration).add(end.saturating_sub(*start) as f64);
            }
            Record::Counter { category, name, value, memory, .. } => {
                let measure = if *memory { Measure::Bytes } else { Measure::Value };
                self.stat(category, name, measure).add(*value as f64);
            }
            // A marker is an instant: counted, with no duration.
            Record::Marker { category, name, .. } => self.stat(category, name, Measure::Duration).add(0.0),
        }
    }

    /// Entries of one domain, ordered by `sort_by` (ties by name).
    fn sorted(entries: &HashMap<String, Stat>, sort_by: SortBy, ascending: bool) -> Vec<(&String, &Stat)> {
        let mut rows: Vec<(&String, &Stat)> = entries.iter().collect();
        rows.sort_by(|a, b| {
            let order = a.1.key(sort_by).total_cmp(&b.1.key(sort_by));
            let order = if ascending { order } else { order.reverse() };
            order.then_with(|| a.0.cmp(b.0))
        });
        rows
    }

    pub fn report(&self, format: ReportFormat, sort_by: SortBy, ascending: bool) -> String {
        match format {
            ReportFormat::Table => self.table(sort_by, ascending),
            ReportFormat::Json => self.json(sort_by, ascending),
        }
    }

    /// MXNet's layout: a block per domain, names left in 25 columns, numbers right in 16.
    fn table(&self, sort_by: SortBy, ascending: bool) -> String {
        let mut out = String::from("\nProfile Statistics:\n\tNote the difference in units for different entries.\n");
        for (domain, entries) in &self.domains {
            let memory = domain == DEVICE_STORAGE;
            let _ = writeln!(out, "{domain}\n=================");
            if memory {
                let _ = writeln!(out, "{:<25}{:>16} {:>16} {:>16} {:>16}", "Name", "Total Count", "Min Use  (kB)", "Max Use  (kB)", "Avg Use  (kB)");
                let _ = writeln!(out, "{:<25}{:>16} {:>16} {:>16} {:>16}", "----", "-----------", "-------------", "-------------", "-------------");
            } else {
                let _ = writeln!(
                    out,
                    "{:<25}{:>16} {:>16} {:>16} {:>16} {:>16}",
                    "Name", "Total Count", "Time (ms)", "Min Time (ms)", "Max Time (ms)", "Avg Time (ms)"
                );
                let _ = writeln!(
                    out,
                    "{:<25}{:>16} {:>16} {:>16} {:>16} {:>16}",
                    "----", "-----------", "---------", "-------------", "-------------", "-------------"
                );
            }
            for (name, stat) in Self::sorted(entries, sort_by, ascending) {
                if memory {
                    let _ = writeln!(out, "{name:<25}{:>16} {:>16.4} {:>16.4} {:>16.4}", stat.count, stat.min(), stat.max(), stat.avg());
                } else {
                    let _ = writeln!(
                        out,
                        "{name:<25}{:>16} {:>16.4} {:>16.4} {:>16.4} {:>16.4}",
                        stat.count,
                        stat.total(),
                        stat.min(),
                        stat.max(),
                        stat.avg()
                    );
                }
            }
            out.push('\n');
        }
        out
    }

    /// MXNet's document: `{"Time": {domain: {name: stats}}, "Memory": {...}, "Unit": {...}}`,
    /// entries in sorted order (so written by hand: a JSON map would reorder them).
    fn json(&self, sort_by: SortBy, ascending: bool) -> String {
        let section = |memory: bool| {
            let domains: Vec<String> = self
                .domains
                .iter()
                .filter(|(domain, _)| (domain.as_str() == DEVICE_STORAGE) == memory)
                .map(|(domain, entries)| {
                    let rows: Vec<String> = Self::sorted(entries, sort_by, ascending)
                        .into_iter()
                        .map(|(name, stat)| {
                            let mut fields = vec![format!("\"Count\": {}", stat.count)];
                            if !memory {
                                fields.push(format!("\"Total\": {}", number(stat.total())));
                            }
                            fields.push(format!("\"Min\": {}", number(stat.min())));
                            fields.push(format!("\"Max\": {}", number(stat.max())));
                            fields.push(format!("\"Avg\": {}", number(stat.avg())));
                            format!("            {}: {{\n                {}\n            }}", quoted(name), fields.join(",\n                "))
                        })
                        .collect();
                    if rows.is_empty() {
                        format!("        {}: {{}}", quoted(domain))
                    } else {
                        format!("        {}: {{\n{}\n        }}", quoted(domain), rows.join(",\n"))
                    }
                })
                .collect();
            if domains.is_empty() {
                "{}".to_string()
            } else {
                format!("{{\n{}\n    }}", domains.join(",\n"))
            }
        };
        format!(
            "{{\n    \"Time\": {},\n    \"Memory\": {},\n    \"Unit\": {{\n        \"Time\": \"ms\",\n        \"Memory\": \"kB\"\n    }}\n}}\n",
            section(false),
            section(true)
        )
    }
}

fn quoted(text: &str) -> String {
    serde_json::to_string(text).expect("a string always serializes")
}

/// A statistic in JSON, to nanosecond (or byte) resolution.
fn number(value: f64) -> String {
    let rounded = (value * 1e6).round() / 1e6;
    serde_json::Number::from_f64(rounded).map_or_else(|| "0".to_string(), |n| n.to_string())
}
