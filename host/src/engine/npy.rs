//! Writing float32 arrays as NumPy `.npy` files (format version 1.0).

use std::io::Write;
use std::path::Path;

/// Writes `values` with `shape` as a little-endian float32 `.npy` file.
pub fn write_f32(path: &Path, shape: &[usize], values: &[f32]) -> std::io::Result<()> {
    let dims: Vec<String> = shape.iter().map(ToString::to_string).collect();
    let shape_text = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape_text}, }}");
    // Magic (6) + version (2) + header length (2) + header + newline: a multiple of 64.
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.div_ceil(64) * 64 - unpadded));
    header.push('\n');
    let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
    file.write_all(b"\x93NUMPY\x01\x00")?;
    file.write_all(&(header.len() as u16).to_le_bytes())?;
    file.write_all(header.as_bytes())?;
    for v in values {
        file.write_all(&v.to_le_bytes())?;
    }
    file.flush()
}

#[cfg(test)]
mod tests {
    #[test]
    fn header_is_aligned_and_data_follows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.npy");
        super::write_f32(&path, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let bytes = std::fs::read(path).unwrap();
        assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00");
        let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
        assert_eq!((10 + header_len) % 64, 0);
        let header = std::str::from_utf8(&bytes[10..10 + header_len]).unwrap();
        assert!(header.contains("'shape': (2, 3)"), "{header}");
        assert_eq!(bytes.len(), 10 + header_len + 24);
        assert_eq!(
            f32::from_le_bytes(bytes[bytes.len() - 4..].try_into().unwrap()),
            6.0
        );
    }
}
