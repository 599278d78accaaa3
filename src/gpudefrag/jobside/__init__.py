"""The job-side protocol: what runs inside a job (`gpudefrag.job`, `gpudefrag.wrapper`) and what drives it from
outside (`checkpoint/`, `control/`, `engines/`) share — environment names, the spool layout, the job folder,
checkpoint statuses, restore tickets and run statuses. It sits below all of them, so none imports another to
learn the protocol.
"""
