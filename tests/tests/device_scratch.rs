mod device_support;
use sampler_backend::burn_tensor::{Tensor, TensorData};
#[test]
fn scratch() {
    for name in sampler_backend::compiled_devices() {
        let d = device_support::device(name).unwrap();
        let ninf = f32::NEG_INFINITY;
        let t = Tensor::<2>::from_data(TensorData::new(vec![ninf, ninf, ninf, 1.0, ninf, ninf, ninf, ninf, 2.0], [3, 3]), &d);
        let (v, i) = t.clone().topk_with_indices(2, 1);
        println!("{name} topk vals {:?} idx {:?}", v.into_data().iter::<f32>().collect::<Vec<_>>(), i.into_data().iter::<i64>().collect::<Vec<_>>());
        let m = t.clone().max_dim(1);
        println!("{name} max {:?}", m.into_data().iter::<f32>().collect::<Vec<_>>());
        let m = t.clone().min_dim(1);
        println!("{name} min {:?}", m.into_data().iter::<f32>().collect::<Vec<_>>());
    }
}
