"""History: git as the store of earlier goldens (golden history, the creep alarm) and bisect."""
