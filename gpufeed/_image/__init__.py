"""The image fast path: plan and fill of image batches, the parent-side feed (cache), the
``num_workers=0`` image iterator, resampling kernels and OpenCV's thread pool."""
