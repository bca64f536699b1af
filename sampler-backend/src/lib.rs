//! sampler-backend
use burn_tensor::Tensor;
pub fn probe() -> Vec<f32> {
    let device = burn_tensor::Device::default();
    let t = Tensor::<2>::from_floats([[1.0, 2.0, 3.0]], &device);
    let (v, i) = t.topk_with_indices(2, 1);
    let _ = i;
    v.into_data().to_vec::<f32>().unwrap()
}
