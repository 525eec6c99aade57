# Sourced by the script tests that train on Fashion-MNIST (from the repository root): sets
# $data to its folder, or skips the test (exit 77) where the dataset package is missing.
data=${CTRAIN_DATA_DIR:-/usr/share/datasets/fashion-mnist}
if [ ! -r "$data/train-images-idx3-ubyte.gz" ] && [ ! -r "$data/train-images-idx3-ubyte" ]; then
    echo "Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)"; exit 77
fi
