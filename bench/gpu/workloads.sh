# Sourced by autotune_workloads.sh and whole_job.sh: the validation's
# workloads, their scripts and steps, and the name a start config gives
# their result files and job labels.
script_of() {
  case $1 in
    seq2seq) echo seq2seq_train.py ;; generate) echo generate_job.py ;;
    vit_compile) echo vit_compile_train.py ;; llama_lora) echo llama_lora_train.py ;;
    resnet50) echo resnet_train.py ;; mlm_accum) echo mlm_accum_train.py ;;
    unet) echo unet_train.py ;; moe) echo moe_train.py ;;
  esac
}
default_steps() {
  case $1 in generate) echo 14 ;; llama_lora) echo 16 ;; mlm_accum) echo 60 ;; *) echo 30 ;; esac
}
steps_of() { local v="STEPS_$1"; echo "${!v:-$(default_steps "$1")}"; }
name() { echo "${1:-defaults}" | tr ':,' '__'; }
