//! The raw samples of `hetsched profile` (history records: one per subgraph instance of a
//! real prefill) as the CSV file written beside the profile.

use hetsched::history::HistoryRecord;

/// The samples as CSV text.
pub fn to_csv(samples: &[HistoryRecord]) -> Result<String, csv::Error> {
    let mut writer = csv::Writer::from_writer(Vec::new());
    for s in samples {
        writer.serialize(s)?;
    }
    let bytes = writer
        .into_inner()
        .map_err(|e| csv::Error::from(e.into_error()))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}
