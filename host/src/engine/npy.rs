//! Float32 matrices as NumPy `.npy` files (the `npyz` crate does the format).

use std::path::Path;

use npyz::WriterBuilder;

/// A float32 `[rows, cols]` matrix, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Matrix {
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// `rows × cols` values.
    pub data: Vec<f32>,
}

impl Matrix {
    /// Row `r`.
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}

/// Writes `values` with `shape` as a little-endian float32 `.npy` file.
pub fn write_f32(path: &Path, shape: &[usize], values: &[f32]) -> std::io::Result<()> {
    let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
    let file = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut writer = npyz::WriteOptions::new()
        .default_dtype()
        .shape(&shape)
        .writer(file)
        .begin_nd()?;
    writer.extend(values.iter().copied())?;
    writer.finish()
}

/// Reads a two-dimensional float32 `.npy` file in C order.
pub fn read_matrix(path: &Path) -> anyhow::Result<Matrix> {
    use anyhow::Context;
    let what = || format!("cannot read {}", path.display());
    let bytes = std::fs::read(path).with_context(what)?;
    let file = npyz::NpyFile::new(&bytes[..]).with_context(what)?;
    let (shape, order) = (file.shape().to_vec(), file.order());
    anyhow::ensure!(
        shape.len() == 2 && order == npyz::Order::C,
        "{}: expected a 2-D C-order array, found shape {shape:?} in {order:?} order",
        path.display()
    );
    let data: Vec<f32> = file
        .into_vec()
        .with_context(|| format!("{}: expected float32 values", path.display()))?;
    Ok(Matrix {
        rows: shape[0] as usize,
        cols: shape[1] as usize,
        data,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn matrices_round_trip_with_an_aligned_header() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.npy");
        super::write_f32(&path, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..6], b"\x93NUMPY");
        let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
        assert_eq!((10 + header_len) % 64, 0);
        let matrix = super::read_matrix(&path).unwrap();
        assert_eq!((matrix.rows, matrix.cols), (2, 3));
        assert_eq!(matrix.row(1), [4.0, 5.0, 6.0]);

        super::write_f32(&path, &[6], &[0.0; 6]).unwrap();
        let err = super::read_matrix(&path).unwrap_err().to_string();
        assert!(err.contains("expected a 2-D C-order array"), "{err}");
    }
}
