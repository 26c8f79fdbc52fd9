"""The bytes layer: data set items as fixed-size records (:mod:`.records`), the byte codec that
runs a proved plan over them (:mod:`.programs`: encode at the master, decode at a worker,
streamed), the gather-XOR kernel it runs on (:mod:`.kernel`), and a worker's persistent block
store (:mod:`.blockstore`)."""
