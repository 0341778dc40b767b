// Pins KEDA only for its CustomResourceDefinitions (config/crd/bases in the module's zip):
// scripts/setup.sh downloads the module (no build) and copies the ScaledObject CRD, which the
// Helm chart's test validates its optional ScaledObjects against (kubeconform and a
// server-side dry run). Nothing imports it.
module stackflow.local/tools/keda

go 1.26.0

require github.com/kedacore/keda/v2 v2.21.0
