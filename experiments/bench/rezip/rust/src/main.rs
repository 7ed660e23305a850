//! rezip-flate2: write a ZIP whose deflated members come from flate2
//! (level 6, `Compression::default()`), keeping member order, names, times
//! and which members are stored. Used by experiments/bench/byte_goals.py.
//!
//!     rezip-flate2 LIST DIR OUT.zip
//!
//! LIST has one member a line: "method<TAB>unix-mtime<TAB>name" (0 stored,
//! 8 deflated; a name ending in "/" is a directory); the bytes are DIR/name.
//! Local headers carry the sizes (no data descriptors); DOS times are UTC.

use std::io::Write;

fn dos_time(unix: i64) -> (u16, u16) {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let date = (((year - 1980).clamp(0, 127) as u16) << 9) | ((month as u16) << 5) | day as u16;
    let time = (((secs / 3600) as u16) << 11) | ((((secs / 60) % 60) as u16) << 5)
        | ((secs % 60) / 2) as u16;
    (time, date)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        eprintln!("usage: rezip-flate2 LIST DIR OUT.zip");
        std::process::exit(2);
    }
    let list = std::fs::read_to_string(&args[1])?;
    let dir = std::path::Path::new(&args[2]);
    let mut out: Vec<u8> = Vec::new();
    let mut central: Vec<u8> = Vec::new();
    let mut count: u16 = 0;
    for line in list.lines() {
        let mut fields = line.splitn(3, '\t');
        let (Some(method), Some(mtime), Some(name)) = (fields.next(), fields.next(), fields.next())
        else {
            return Err(format!("bad line {line:?}").into());
        };
        let method: u16 = method.parse()?;
        let (time, date) = dos_time(mtime.parse()?);
        let data = if name.ends_with('/') { Vec::new() } else { std::fs::read(dir.join(name))? };
        let crc = crc32fast::hash(&data);
        let stored = if method == 8 {
            let mut encoder =
                flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
            encoder.write_all(&data)?;
            encoder.finish()?
        } else {
            data.clone()
        };
        let offset = out.len() as u32;
        let fixed = |buf: &mut Vec<u8>| {
            buf.extend_from_slice(&20u16.to_le_bytes()); // version needed
            buf.extend_from_slice(&0u16.to_le_bytes()); // flags
            buf.extend_from_slice(&method.to_le_bytes());
            buf.extend_from_slice(&time.to_le_bytes());
            buf.extend_from_slice(&date.to_le_bytes());
            buf.extend_from_slice(&crc.to_le_bytes());
            buf.extend_from_slice(&(stored.len() as u32).to_le_bytes());
            buf.extend_from_slice(&(data.len() as u32).to_le_bytes());
            buf.extend_from_slice(&(name.len() as u16).to_le_bytes());
            buf.extend_from_slice(&0u16.to_le_bytes()); // extra length
        };
        out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        fixed(&mut out);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&stored);
        central.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        central.extend_from_slice(&0x031eu16.to_le_bytes()); // made by: Unix, 3.0
        fixed(&mut central);
        central.extend_from_slice(&0u16.to_le_bytes()); // comment length
        central.extend_from_slice(&0u16.to_le_bytes()); // disk
        central.extend_from_slice(&0u16.to_le_bytes()); // internal attributes
        let mode: u32 = if name.ends_with('/') { 0o040755 } else { 0o100644 };
        central.extend_from_slice(&(mode << 16).to_le_bytes());
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(name.as_bytes());
        count += 1;
    }
    let central_offset = out.len() as u32;
    out.extend_from_slice(&central);
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&central_offset.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    std::fs::write(&args[3], out)?;
    Ok(())
}
